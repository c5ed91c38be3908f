"""One row in one round: start its proxy, drive its load, measure, decide ok or failed, stop
the proxy. Two measuring flows cover every row:

- requests (mcp, mix, big, h2, handshake): optional warm-up, then the measured run between two
  samples of the proxy's CPU (and the backend's, the cores', the machine's), with the backend
  nginx's connection probes on either side for new-up;
- held connections (streams, idle): warm, baseline memory, open them all, hold for the
  measured seconds, memory again, close; for streams also the events' latency.

The failure rules are bench/run.sh's: a proxy that does not start, any error of the load tool
(connect, read, write, timeout, non-2xx), a misroute, or an SSE answer that is not an event
stream fails the row. An expected-miss row's misroutes are shown, not failed on. Since the
upstream rows, a request that reached the backend nginx in another protocol than the row's
(EXPECTED_UPSTREAM: HTTP version, and TLS 1.3 or none) fails it too.
"""

import http.client
import json
import time

from . import load, measure, peers, rows
from .load import LoadError
from .peers import HOST, PeerError
from .tools import log


# What the backend nginx logs ($server_protocol $ssl_protocol) for every request of a row, by the
# row's upstream: TLS rows must have chosen TLS 1.3 (the backends offer 1.2 too).
EXPECTED_UPSTREAM = {rows.UP_H1: "HTTP/1.1 -", rows.UP_TLS: "HTTP/1.1 TLSv1.3", rows.UP_H2C: "HTTP/2.0 -"}


def backend_log_stats(text, tag_from, tag_to, c0=None, c1=None, skip_uris=("/mcp?sse-direct",)):
    """The backend nginx's access log (bench/peers/nginx-backend.conf.in's `bench` format)
    between the requests /probe?tag=<tag_from> and /probe?tag=<tag_to>, probes and skip_uris
    left out:
    - shares: requests per backend port;
    - conns: the distinct $connection numbers that carried a request, only those in (c0, c1)
      when given (the one worker numbers accepted connections in order: new-up);
    - protocols: requests per "$server_protocol $ssl_protocol";
    - ciphers: requests per TLS cipher;
    - tls_conns, tls_resumed: of those connections, the TLS ones, and how many of them resumed
      a session ($ssl_session_reused "r")."""
    on, shares, protocols, ciphers, conns = False, {}, {}, {}, {}
    for line in text.splitlines():
        parts = line.split(" ", 6)
        if len(parts) < 7:
            continue
        conn, port, proto, tls, cipher, reused, uri = parts
        if uri == f"/probe?tag={tag_from}":
            on = True
            continue
        if uri == f"/probe?tag={tag_to}":
            break
        if not on or uri.startswith("/probe") or uri in skip_uris:
            continue
        shares[port] = shares.get(port, 0) + 1
        key = f"{proto} {tls}"
        protocols[key] = protocols.get(key, 0) + 1
        if cipher != "-":
            ciphers[cipher] = ciphers.get(cipher, 0) + 1
        if c0 is None or c0 < int(conn) < c1:
            conns[conn] = (tls != "-", reused == "r")
    tls_conns = [v for v in conns.values() if v[0]]
    return {"shares": shares, "conns": len(conns), "protocols": protocols, "ciphers": ciphers,
            "tls_conns": len(tls_conns), "tls_resumed": sum(1 for v in tls_conns if v[1])}


def _round(x, n):
    return None if x is None else round(x, n)


NO_REQUEST = "no request completed"
# How long a smoke row that completed no request is loaded the second time (the smoke run's
# length before it became 0.3 s).
SECOND_LOOK_S = 1


def second_look(s, r):
    """Whether the row's result `r` earns a second run: only in a smoke run, only when its load
    ran shorter than a second, and only for a row that failed by completing no request."""
    return s.smoke and s.duration < SECOND_LOOK_S and r["status"] == "failed" and r["error"] == NO_REQUEST


class Runner:
    def __init__(self, ctx):
        self.ctx = ctx
        self.s = ctx.s
        self.peers = ctx.peers
        self.procs = ctx.procs
        self.all_cpus = list(range(self.s.nproc))
        self.load_cpus = measure.expand_cpus(self.s.load_cpus)
        self.awake = {"load": [], "proxy": []}

    # --- one row, one round ----------------------------------------------------------------
    def run(self, row, rnd):
        r = self._run_once(row, rnd)
        if second_look(self.s, r):
            # A smoke row's 0.3 s can pass without an answer when other work holds both cores
            # (the test command runs the smoke beside a build): such a row is run once more,
            # for a second. Errors, misroutes and a proxy that does not start fail at once.
            log(f"{row.name} [round {rnd}/{self.s.rounds}]: no request completed in {self.s.duration} s; "
                f"once more for {SECOND_LOOK_S} s")
            short, self.s.duration = self.s.duration, SECOND_LOOK_S
            try:
                r = self._run_once(row, rnd)
            finally:
                self.s.duration = short
            r["second_look"] = True
        return r

    def _run_once(self, row, rnd):
        r = {"round": rnd, "status": "failed", "error": None}
        tag = f"{row.name} [round {rnd}/{self.s.rounds}]"
        log(f"{tag}: {row.desc}")
        d = self.ctx.tmp / "rows" / row.name / f"r{rnd}"
        d.mkdir(parents=True, exist_ok=True)
        peer = None
        self._begin_tag = None
        try:
            if row.upstream == rows.UP_TLS:
                # The upstream TLS connections of the start-up and warm-up are counted too (those
                # of the measured run alone are few): from this probe on (bench/README.md).
                self._begin_tag = f"{row.name}-{rnd}-begin-{time.time_ns()}"
                self._probe(self._begin_tag)
            peer = self.peers.start(row)
            if peer.tls:
                r["tls"] = peer.tls
            if row.awake:
                self._start_awake(row)
            if row.load in (rows.STREAMS, rows.IDLE):
                self._held(row, peer, d, r)
            else:
                self._requests(row, peer, d, r)
            if peer.proc is not None and peer.proc.poll() is not None and r["status"] != "failed":
                self._fail(r, "proxy process died during the run")
        except PeerError as e:
            self._fail(r, str(e))
        except LoadError as e:
            self._fail(r, str(e))
        finally:
            self._stop_awake()
            self.peers.stop(peer)
        if r["status"] == "failed":
            log(f"{tag}: FAILED: {r['error']}")
        else:
            log(f"{tag}: {self._summary(row, r)}")
        return r

    @staticmethod
    def _fail(r, msg):
        r["status"] = "failed"
        r["error"] = msg

    @staticmethod
    def _summary(row, r):
        if row.load in (rows.STREAMS, rows.IDLE):
            m = r["memory"]
            out = f"{m['opened']} open in {m['open_s']} s, {m['kib_per_conn']} KiB each"
            lat = r.get("events")
            if lat:
                out += f", event p99 {lat['via_proxy_p99_ms']} ms via proxy, {lat['direct_p99_ms']} ms direct"
            return out
        out = (f"{r['rps']} req/s, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
               f"cpu {r['proxy_cpu_us_per_req']} us/req, new upstream conns {r['new_upstream_conns']}")
        if r.get("resumed_pct") is not None:
            out += f", resumed {r['resumed_pct']}%"
        up = r.get("upstream")
        if up and up.get("tls_conns") is not None:
            out += f", upstream TLS connections {up['tls_conns']} ({up['tls_resumed']} resumed)"
        if r["status"] == "expected-miss":
            out += f" ({r['note']})"
        return out

    # --- the -awake rows ----------------------------------------------------------------------
    def _start_awake(self, row):
        """One SCHED_IDLE busy loop on each load cpu and each proxy cpu: they run only when
        nothing else on that cpu wants to, so a woken proxy, backend or client preempts them at
        once, and an idle vCPU never halts (see bench/README.md, "Why the -awake rows")."""
        proxy = measure.expand_cpus(self.s.proxy_cpus_for(row))
        for kind, cpus in (("load", self.load_cpus), ("proxy", [c for c in proxy if c not in self.load_cpus])):
            for c in cpus:
                p = self.procs.spawn(["sh", "-c", "while :; do :; done"], cpus=c, idle=True)
                self.awake[kind].append(p)

    def _stop_awake(self):
        for kind in self.awake:
            for p in self.awake[kind]:
                self.procs.stop(p, grace=1.0)
            self.awake[kind] = []

    def _awake_ticks(self, kind):
        return measure.pids_ticks(p.pid for p in self.awake[kind])

    # --- samples -----------------------------------------------------------------------------
    def _sample(self, peer, extra_pids=()):
        pcpus = measure.expand_cpus(self.s.proxy_cpus_for(peer.row))
        return {
            "proxy": measure.tree_ticks(peer.proc.pid) if peer.proc else 0,
            "backend": measure.pids_ticks(self.peers.backend_pids()),
            "sleeps": measure.tree_sleeps(self.peers.backend.pid) if self.peers.backend else 0,
            "pcpu": measure.cpu_sample(pcpus), "lcpu": measure.cpu_sample(self.load_cpus),
            "all": measure.cpu_sample(self.all_cpus),
            "awake_p": self._awake_ticks("proxy"), "awake_l": self._awake_ticks("load"),
            "children": measure.children_ticks(),
            "extra": measure.pids_ticks(extra_pids),
        }

    def _cpu_fields(self, peer, a, b, proxy_requests, backend_requests, r):
        """CPU per request of proxy and backend, how busy the cores were, other processes."""
        tck = measure.CLK_TCK
        dp = b["proxy"] - a["proxy"]
        r["proxy_cpu_us_per_req"] = r["proxy_core_busy_pct"] = None
        if peer.proc is not None:
            # on a one-core row the proxy's cpu is the load's: its busy loop is the load's too
            awake = b["awake_p"] - a["awake_p"] + (b["awake_l"] - a["awake_l"] if peer.row.one_core else 0)
            r["proxy_core_busy_pct"] = measure.busy_pct(a["pcpu"], b["pcpu"], awake)
            if proxy_requests > 0:
                r["proxy_cpu_us_per_req"] = round(dp * 1e6 / tck / proxy_requests, 2)
        db = b["backend"] - a["backend"]
        r["backend_cpu_us_per_req"] = round(db * 1e6 / tck / backend_requests, 2) if backend_requests else None
        r["backend_sleeps_per_1k_req"] = (round((b["sleeps"] - a["sleeps"]) * 1000 / backend_requests)
                                          if backend_requests else None)
        r["load_core_busy_pct"] = measure.busy_pct(a["lcpu"], b["lcpu"], b["awake_l"] - a["awake_l"])
        ours = (dp + db + (b["children"] - a["children"]) + (b["extra"] - a["extra"])
                + (b["awake_p"] - a["awake_p"]) + (b["awake_l"] - a["awake_l"]))
        dt = b["all"][0] - a["all"][0]
        other = None
        if dt > 0:
            other = round(100.0 * max((dt - (b["all"][1] - a["all"][1])) - ours, 0) / dt, 1)
        r["other_processes_busy_pct"] = other
        if other is not None and other > 10:
            log(f"{peer.row.name} [round {r['round']}/{self.s.rounds}]: WARNING: other processes used "
                f"{other}% of the machine during the run: this round's numbers are noisy")

    # --- the backend nginx's connection numbers ------------------------------------------------
    def _probe(self, tag):
        try:
            status, body = peers.get(HOST, self.peers.ports.backend[0], f"/probe?tag={tag}", timeout=3)
        except (OSError, http.client.HTTPException) as e:
            raise LoadError(f"backend probe failed: {e!r}")
        if status != 200 or not body.strip().isdigit():
            raise LoadError(f"backend probe failed: status {status}, {body[:80]!r}")
        return int(body)

    def _backend_log(self):
        return self.peers.backend_dir / "access.log"

    def _wait_tag(self, tag):
        """Until the backend nginx wrote the probe of `tag` to its access log (it writes its
        buffer every flush interval). Each look reads only what was added since the last."""
        deadline = time.monotonic() + 6
        needle = f"tag={tag}\n".encode()
        pos, tail = 0, b""
        while time.monotonic() < deadline:
            try:
                with open(self._backend_log(), "rb") as f:
                    f.seek(pos)
                    new = f.read()
                pos += len(new)
                if needle in tail + new:
                    return
                tail = (tail + new)[-len(needle):]
            except OSError:
                pass
            time.sleep(peers.POLL)
        raise LoadError("backend access log not flushed")

    def _conn_stats(self, row, t0, t1, c0, c1):
        """backend_log_stats of the measured run, with every port of the row's backends in
        shares (0 when none reached it)."""
        st = backend_log_stats(self._backend_log().read_text(errors="replace"), t0, t1, c0, c1)
        ports = self.peers.ports.upstream[row.upstream]
        st["shares"] = {**{str(p): 0 for p in ports}, **st["shares"]}
        return st

    def _metrics(self, peer):
        if peer.admin_port is None:
            return None
        try:
            status, body = peers.get(HOST, peer.admin_port, "/metrics", timeout=2)
        except (OSError, http.client.HTTPException):
            return None
        return body.decode(errors="replace") if status == 200 else None

    # --- flow 1: requests ----------------------------------------------------------------------
    def _load_fn(self, row, peer, d):
        """fn(duration, tag, probes) -> load result, for the row's load."""
        s, b = self.s, self.s.bench_dir
        url = peer.url
        if row.load == rows.MCP:
            authorization = self.ctx.peers.authorization(row) if row.auth else None
            return lambda dur, tag, probes: load.wrk(self.ctx, url, b / "mcp.lua", [row.key], dur,
                                                     s.connections, d / f"{tag}.out", authorization)
        if row.load == rows.BIG:
            return lambda dur, tag, probes: load.wrk(self.ctx, url, b / "big.lua", [row.body_bytes], dur,
                                                     s.connections, d / f"{tag}.out")
        if row.load == rows.H2:
            return lambda dur, tag, probes: load.h2load(self.ctx, url, dur, d, tag)
        if row.load == rows.HANDSHAKE:
            return lambda dur, tag, probes: load.tls_handshakes(self.ctx, url, dur, row.resume, d / f"{tag}.out")
        if row.load == rows.MIX:
            args = [row.key, s.pending_pct] + ([s.mix_pause_ms] if row.paced else [])

            def mix(dur, tag, probes):
                sse = []
                if probes:
                    direct = f"http://{HOST}:{self.peers.ports.backend[0]}/mcp?sse-direct"
                    for name, u in (("proxy", url), ("direct", direct)):
                        sse.append(load.Wrk(self.ctx, u, b / "sse.lua", [s.sse_pause_ms], dur,
                                            s.sse_connections, d / f"sse-{name}.out").start())
                res = load.wrk(self.ctx, url, b / "mix.lua", args, dur, s.connections, d / f"{tag}.out")
                if sse:
                    try:
                        px = sse[0].result()
                    except LoadError as e:
                        raise LoadError(f"SSE probe through the proxy failed: {e}")
                    try:
                        di = sse[1].result()
                    except LoadError as e:
                        raise LoadError(f"SSE probe to the backend failed: {e}")
                    res["sse"] = {"via_proxy": px, "direct": di}
                return res
            return mix
        raise AssertionError(row.load)

    def _requests(self, row, peer, d, r):
        fn = self._load_fn(row, peer, d)
        probes = row.load == rows.MIX and self.s.sse_probe
        if self.s.warmup > 0:
            try:
                fn(self.s.warmup, "warmup", False)
            except LoadError as e:
                raise LoadError(f"warm-up: {e}")
        warm = None
        if self._begin_tag:
            tag = f"{row.name}-{r['round']}-warm-{time.time_ns()}"
            self._probe(tag)
            self._wait_tag(tag)
            warm = backend_log_stats(self._backend_log().read_text(errors="replace"), self._begin_tag, tag)
        t0, t1 = f"{row.name}-{r['round']}-start-{time.time_ns()}", f"{row.name}-{r['round']}-end-{time.time_ns()}"
        self._backend_log().write_bytes(b"")  # nginx appends (O_APPEND): the log stays small
        c0 = self._probe(t0)
        m0 = self._metrics(peer)
        a = self._sample(peer)
        res = fn(self.s.duration, "run", probes)
        b = self._sample(peer)
        if peer.proc is not None:
            r["proxy_threads"] = measure.tree_threads(peer.proc.pid)
        m1 = self._metrics(peer)
        c1 = self._probe(t1)
        self._wait_tag(t1)
        st = self._conn_stats(row, t0, t1, c0, c1)
        new_up, shares = st["conns"], st["shares"]
        r["upstream"] = {"protocols": st["protocols"], "ciphers": st["ciphers"]}
        if warm is not None:
            # start-up and warm-up, then the measured run's new connections
            r["upstream"]["tls_conns"] = warm["tls_conns"] + st["tls_conns"]
            r["upstream"]["tls_resumed"] = warm["tls_resumed"] + st["tls_resumed"]

        req = res["requests"]
        errors = dict(res["errors"])
        if row.load in (rows.MCP, rows.MIX, rows.BIG):
            errors.setdefault("sse_probe", 0)  # the key bench/run.sh's JSON had for every row
        r["sse_probe"] = None
        sse = res.get("sse")
        px_req = di_req = 0
        sse_msg = None
        if sse is not None:
            px, di = sse["via_proxy"], sse["direct"]
            px_req, di_req = px["requests"], di["requests"]
            e_px, e_di = sum(px["errors"].values()), sum(di["errors"].values())
            errors["sse_probe"] = e_px + e_di
            if e_px + e_di:
                sse_msg = (f"SSE probe: {e_px} errors through the proxy, {e_di} direct "
                           f"({json.dumps(px['errors'])} and {json.dumps(di['errors'])}; bad = not an event stream)")
            if not (px_req and di_req):
                sse_msg = f"SSE probe completed no request (through the proxy {px_req}, direct {di_req})"
            r["sse_probe"] = {
                "via_proxy": {k: px[k] for k in ("requests", "p50_ms", "p99_ms", "max_ms")},
                "direct": {k: di[k] for k in ("requests", "p50_ms", "p99_ms", "max_ms")},
                "added_p50_ms": _round(px["p50_ms"] - di["p50_ms"], 3),
                "added_p99_ms": _round(px["p99_ms"] - di["p99_ms"], 3),
            }
        if row.load == rows.H2:
            # one key per h2load run: every request must have reached one backend
            errors["misrouted"] = sum(shares.values()) - max(shares.values())
            r["h2"] = {"connections": self.s.h2_connections, "streams_per_connection": self.s.h2_streams,
                       **res["extra"]}
        r.update({
            "requests": req, "duration_s": res["duration_s"],
            "rps": round(req / res["duration_s"]) if res["duration_s"] else None,
            "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"], "max_ms": res["max_ms"],
            "errors_total": sum(errors.values()), "errors": errors,
            "new_upstream_conns": new_up, "backend_accepts": c1 - c0 - 1, "backend_requests": shares,
            "pending_calls": res["extra"].get("pending_calls"),
            "confirmed_calls": res["extra"].get("confirmed_calls"),
            "router_metrics": metrics_delta(m0, m1) if m0 and m1 else None,
        })
        if row.load == rows.HANDSHAKE:
            conns = req + errors.get("status", 0)
            r["resumed"] = res["extra"]["resumed"]
            r["resumed_pct"] = round(100.0 * r["resumed"] / conns, 1) if conns else None
            r["tls_versions"] = res["extra"]["tls_versions"]
        self._cpu_fields(peer, a, b, req + px_req, req + px_req + di_req, r)

        if req == 0:
            return self._fail(r, NO_REQUEST)
        misrouted = errors.get("misrouted", 0)
        hard = r["errors_total"] - (misrouted if row.expect_miss else 0)
        if hard > 0 or sse_msg:
            parts = [f"{k} {v}" for k, v in errors.items() if v and k != "sse_probe"]
            msg = f"{r['errors_total'] - errors.get('sse_probe', 0)} errors ({', '.join(parts)})" if parts else ""
            if row.load == rows.HANDSHAKE and res["extra"].get("first_error"):
                msg += f"; first: {res['extra']['first_error']}"
            if sse_msg:
                msg += ("; " if msg else "") + sse_msg
            return self._fail(r, msg)
        want = EXPECTED_UPSTREAM[row.upstream]
        other = {k: v for k, v in st["protocols"].items() if k != want}
        if other:
            return self._fail(r, f"requests reached the backends as {json.dumps(other)}, not {want!r} only")
        if row.load == rows.HANDSHAKE:
            if row.resume and (r["resumed_pct"] or 0) < 50:
                return self._fail(r, f"sessions were not resumed ({r['resumed']} of {conns} connections)")
            if not row.resume and r["resumed"]:
                return self._fail(r, f"{r['resumed']} handshakes resumed in a full-handshake row")
            if r["tls_versions"] != ["TLSv1.3"]:
                return self._fail(r, f"negotiated {r['tls_versions']}, not TLSv1.3 only")
        if row.expect_miss:
            confirmed = r["confirmed_calls"] or 0
            if misrouted:
                r["status"] = "expected-miss"
                r["note"] = f"expected miss: {misrouted} of {confirmed} repeated keys reached another backend"
            else:
                r["status"] = "ok"
                r["note"] = f"the expected miss did not show: 0 of {confirmed} repeated keys misrouted"
            return
        r["status"] = "ok"
        if r["router_metrics"]:
            log(f"{row.name} [round {r['round']}/{self.s.rounds}]: router counters during the run: "
                f"{json.dumps(r['router_metrics'])}")

    # --- flow 2: held connections --------------------------------------------------------------
    def _held(self, row, peer, d, r):
        mode = "streams" if row.load == rows.STREAMS else "idle"
        count = self.s.streams if mode == "streams" else self.s.idle_conns
        drops0 = measure.listen_drops()
        client = load.StreamClient(self.ctx, mode, peer.port, self.peers.ports.sse, count, d / "client.out")
        try:
            warm = client.warm()
            pid = peer.proc.pid
            rss_base = measure.tree_rss_bytes(pid)
            client.open()
            a = self._sample(peer, [client.proc.pid])
            rss_open = measure.tree_rss_bytes(pid)
            time.sleep(self.s.duration)
            rss_held = measure.tree_rss_bytes(pid)
            b = self._sample(peer, [client.proc.pid])
            r["proxy_threads"] = measure.tree_threads(pid)
            res = client.close()
        finally:
            if client.proc.poll() is None:
                self.procs.stop(client.proc)
        drops1 = measure.listen_drops()
        n = res["opened"]
        errors = dict(res["errors"])
        r["listen_drops"] = drops1 - drops0 if drops0 is not None and drops1 is not None else None
        r["errors"] = errors
        r["errors_total"] = sum(errors.values())
        r["memory"] = {
            "requested": count, "opened": n, "open_s": res["open_s"], "held_s": res["held_s"],
            "warm_opened": warm["opened"], "rss_base_bytes": rss_base, "rss_open_bytes": rss_open,
            "rss_held_bytes": rss_held,
            "kib_per_conn": round((rss_held - rss_base) / n / 1024, 2) if n else None,
            "backends": res["backends"],
        }
        tck = measure.CLK_TCK
        r["proxy_cpu_ms_held"] = round((b["proxy"] - a["proxy"]) * 1000 / tck, 1)
        self._cpu_fields(peer, a, b, 0, 0, r)
        if mode == "streams":
            px, di = res["latency"]["proxy"], res["latency"]["direct"]
            r["events"] = {
                "via_proxy_events": px["events"], "direct_events": di["events"],
                "via_proxy_p50_ms": _ms(px["p50_us"]), "via_proxy_p99_ms": _ms(px["p99_us"]),
                "via_proxy_max_ms": _ms(px["max_us"]),
                "direct_p50_ms": _ms(di["p50_us"]), "direct_p99_ms": _ms(di["p99_us"]),
                "direct_max_ms": _ms(di["max_us"]),
                "added_p50_ms": _diff(px["p50_us"], di["p50_us"]),
                "added_p99_ms": _diff(px["p99_us"], di["p99_us"]),
                "direct_streams": res["direct_opened"],
            }
            if px["events"]:
                r["proxy_cpu_us_per_event"] = round((b["proxy"] - a["proxy"]) * 1e6 / tck / px["events"], 1)
        if r["errors_total"]:
            parts = ", ".join(f"{k} {v}" for k, v in errors.items() if v)
            drops = f"; the kernel dropped {r['listen_drops']} SYNs on full listen queues" if r["listen_drops"] else ""
            return self._fail(r, f"{r['errors_total']} errors ({parts}); first: {res['first_error']}{drops}")
        if n < count:
            return self._fail(r, f"only {n} of {count} opened")
        if mode == "streams" and not (r["events"]["via_proxy_events"] and r["events"]["direct_events"]):
            return self._fail(r, "no event crossed during the hold (through the proxy "
                                 f"{r['events']['via_proxy_events']}, direct {r['events']['direct_events']})")
        r["status"] = "ok"


def _ms(us):
    return None if us is None else round(us / 1000.0, 3)


def _diff(a_us, b_us):
    return None if a_us is None or b_us is None else round((a_us - b_us) / 1000.0, 3)


def metrics_delta(before, after):
    """Deltas of the router's counters over the run (Prometheus text): route decisions by
    source, pins created, upstream and router errors; None when it has none of them."""
    def parse(text):
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
        return out
    b, a = parse(before), parse(after)
    dec, pins, uerr, rerr, seen = {}, 0, 0, 0, False
    for k, v in a.items():
        dv = v - b.get(k, 0.0)
        if k.startswith("mrtr_route_decisions_total{"):
            src = k.split('source="', 1)[1].split('"', 1)[0] if 'source="' in k else "?"
            dec[src] = dec.get(src, 0) + int(dv)
            seen = True
        elif k.startswith("mrtr_pins_created_total"):
            pins += int(dv)
            seen = True
        elif k.startswith("mrtr_upstream_errors_total"):
            uerr += int(dv)
            seen = True
        elif k.startswith("mrtr_router_errors_total"):
            rerr += int(dv)
            seen = True
    if not seen:
        return None
    return {"route_decisions": dec, "pins_created": pins, "upstream_errors": uerr, "router_errors": rerr}
