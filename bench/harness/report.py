"""Per row, the medians over the rounds (min-max for CPU, sums for errors, maxima for new-up and
threads), the tables on stdout, and the JSON (bench/results/latest.json or smoke.json), which
keeps every round's raw numbers in rows[].rounds[] next to the row's aggregates.
"""

import json
import time

from . import measure, rows

OK = ("ok", "expected-miss")


def _vals(rounds, key, sub=None):
    out = []
    for r in rounds:
        v = r.get(key)
        if sub is not None:
            v = v.get(sub) if isinstance(v, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(v)
    return out


def _r(v, nd):
    return None if v is None else (round(v) if nd == 0 else round(v, nd))


def aggregate(row, rounds, n_rounds):
    """The row's entry of the JSON: aggregates over its rounds, and the rounds."""
    ok_rounds = [r for r in rounds if r["status"] in OK]
    errs = [f"round {r['round']}: {r['error'] or 'did not run'}" for r in rounds if r["status"] not in OK]
    status = "ok" if len(ok_rounds) == n_rounds else "failed"
    if status == "ok" and any(r["status"] == "expected-miss" for r in rounds):
        status = "expected-miss"
    error = None
    if errs:
        error = errs[0] + (f" (and {len(errs) - 1} more failed round(s))" if len(errs) > 1 else "")
    med = lambda k, nd, sub=None: _r(measure.median(_vals(rounds, k, sub)), nd)
    e = {
        "peer": row.name, "description": row.desc, "kind": row.load, "baseline_row": row.baseline,
        "status": status, "error": error, "rounds_ok": len(ok_rounds),
        "expected_miss": row.expect_miss,
        "note": next((r["note"] for r in rounds if r.get("note")), None),
        "errors_total": sum(_vals(rounds, "errors_total")),
        "proxy_threads": max(_vals(rounds, "proxy_threads"), default=None),
        "other_processes_busy_pct_max": max(_vals(rounds, "other_processes_busy_pct"), default=None),
        "tls": next((r["tls"] for r in rounds if r.get("tls")), None),
    }
    if row.load in (rows.STREAMS, rows.IDLE):
        e["memory"] = {
            "opened": min(_vals(rounds, "memory", "opened"), default=None),
            "open_s": med("memory", 3, "open_s"),
            "rss_base_bytes": med("memory", 0, "rss_base_bytes"),
            "rss_held_bytes": med("memory", 0, "rss_held_bytes"),
            "kib_per_conn": med("memory", 2, "kib_per_conn"),
            "kib_per_conn_min": _r(min(_vals(rounds, "memory", "kib_per_conn"), default=None), 2),
            "kib_per_conn_max": _r(max(_vals(rounds, "memory", "kib_per_conn"), default=None), 2),
        }
        if row.load == rows.STREAMS:
            e["events"] = {k: med("events", 3, k) for k in (
                "via_proxy_p50_ms", "via_proxy_p99_ms", "direct_p50_ms", "direct_p99_ms",
                "added_p50_ms", "added_p99_ms")}
            e["events"]["via_proxy_events"] = sum(_vals(rounds, "events", "via_proxy_events"))
            e["events"]["direct_events"] = sum(_vals(rounds, "events", "direct_events"))
            e["events"]["added_p99_ms_min"] = _r(min(_vals(rounds, "events", "added_p99_ms"), default=None), 3)
            e["events"]["added_p99_ms_max"] = _r(max(_vals(rounds, "events", "added_p99_ms"), default=None), 3)
            e["proxy_cpu_us_per_event"] = med("proxy_cpu_us_per_event", 1)
        e["proxy_core_busy_pct"] = med("proxy_core_busy_pct", 1)
    else:
        cpu = _vals(rounds, "proxy_cpu_us_per_req")
        e.update({
            "rps": med("rps", 0), "p50_ms": med("p50_ms", 3), "p99_ms": med("p99_ms", 3),
            "max_ms": _r(max(_vals(rounds, "max_ms"), default=None), 3),
            "proxy_cpu_us_per_req": med("proxy_cpu_us_per_req", 2),
            "proxy_cpu_us_per_req_min": _r(min(cpu, default=None), 2),
            "proxy_cpu_us_per_req_max": _r(max(cpu, default=None), 2),
            "proxy_core_busy_pct": med("proxy_core_busy_pct", 1),
            "backend_cpu_us_per_req": med("backend_cpu_us_per_req", 2),
            "backend_sleeps_per_1k_req": med("backend_sleeps_per_1k_req", 0),
            "load_core_busy_pct": med("load_core_busy_pct", 1),
            "new_upstream_conns": max(_vals(rounds, "new_upstream_conns"), default=None),
            "sse_probe": None,
        })
        if row.load == rows.HANDSHAKE:
            e["resumed_pct"] = med("resumed_pct", 1)
        ups = [r["upstream"] for r in rounds if r.get("upstream")]
        e["upstream"] = {"kind": row.upstream, "plain_row": row.plain or None,
                         "protocols": _merge(u["protocols"] for u in ups),
                         "ciphers": _merge(u["ciphers"] for u in ups)}
        if any("tls_conns" in u for u in ups):
            e["upstream"]["tls_conns"] = sum(u.get("tls_conns", 0) for u in ups)
            e["upstream"]["tls_resumed"] = sum(u.get("tls_resumed", 0) for u in ups)
        if any(r.get("sse_probe") for r in rounds):
            sp = [r["sse_probe"] for r in rounds if r.get("sse_probe")]
            m = lambda f: _r(measure.median([f(x) for x in sp if f(x) is not None]), 3)
            add99 = [x["added_p99_ms"] for x in sp if x["added_p99_ms"] is not None]
            e["sse_probe"] = {
                "via_proxy_p50_ms": m(lambda x: x["via_proxy"]["p50_ms"]),
                "via_proxy_p99_ms": m(lambda x: x["via_proxy"]["p99_ms"]),
                "direct_p50_ms": m(lambda x: x["direct"]["p50_ms"]),
                "direct_p99_ms": m(lambda x: x["direct"]["p99_ms"]),
                "added_p50_ms": m(lambda x: x["added_p50_ms"]),
                "added_p99_ms": m(lambda x: x["added_p99_ms"]),
                "added_p99_ms_min": _r(min(add99, default=None), 3),
                "added_p99_ms_max": _r(max(add99, default=None), 3),
            }
    e["rounds"] = rounds
    return e


def _merge(dicts):
    out = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return round(a / b, 2)


# Pairs of rows whose paired CPU ratio is printed (and kept in the JSON) when both ran: the
# router on its floors, and the floors beside HAProxy (bench/README.md, "Paired CPU ratios").
PAIRS = (("mrtr-header", "haproxy-header"), ("mrtr-body", "haproxy-body"), ("mrtr-header", "hyper-floor"),
         ("mrtr-header", "hyper-floor-scan"), ("hyper-floor-scan", "hyper-floor"),
         ("mrtr-h2c", "haproxy-h2c"), ("mrtr-h2c", "hyper-floor-h2c"), ("hyper-floor-h2c", "haproxy-h2c"))


def paired_ratio(a, b):
    """The median over rounds of a's CPU per request divided by b's in the same round (rounds
    both passed). One round's rows ran within minutes of each other, so a drift of the VM from
    round to round cancels out, where a ratio of the two medians can set one row's fast round
    against the other's slow one."""
    def by_round(e):
        return {r["round"]: r.get("proxy_cpu_us_per_req") for r in e["rounds"] if r["status"] in OK}
    ra, rb = by_round(a), by_round(b)
    ratios = [ra[k] / rb[k] for k in ra if k in rb and ra[k] and rb[k]]
    return None if not ratios else round(measure.median(ratios), 2)


def paired_ratios(entries):
    """{"a/b": paired ratio} for the PAIRS whose two rows both ran."""
    by = {e["peer"]: e for e in entries}
    return {f"{a}/{b}": paired_ratio(by[a], by[b]) for a, b in PAIRS
            if a in by and b in by and "rps" in by[a] and "rps" in by[b]}


def add_ratios(entries):
    """rps/cpu against each row's baseline row (an HAProxy row of the same load), memory per
    connection against the HAProxy and nginx rows of the same kind, when those ran and passed."""
    by = {e["peer"]: e for e in entries}
    for e in entries:
        base = by.get(e["baseline_row"])
        usable = base is not None and base["status"] in OK
        if "rps" in e:
            e["rps_vs_baseline"] = _ratio(e["rps"], base["rps"]) if usable else None
            e["cpu_vs_baseline"] = _ratio(e["proxy_cpu_us_per_req"], base["proxy_cpu_us_per_req"]) if usable else None
            e["cpu_vs_baseline_paired"] = paired_ratio(e, base) if usable else None
        up = e.get("upstream") or {}
        if up.get("plain_row"):
            # the upstream rows against the same peer's plain-HTTP/1.1 row of the same run
            plain = by.get(up["plain_row"])
            ok = plain is not None and plain["status"] in OK and e["status"] in OK
            cpu = e["proxy_cpu_us_per_req"]
            pcpu = plain["proxy_cpu_us_per_req"] if ok else None
            up["rps_vs_plain"] = _ratio(e["rps"], plain["rps"]) if ok else None
            up["cpu_vs_plain"] = _ratio(cpu, pcpu) if ok else None
            up["cpu_added_us"] = round(cpu - pcpu, 2) if ok and None not in (cpu, pcpu) else None
        if "memory" in e:
            kind = "streams" if e["kind"] == rows.STREAMS else "idle-conns"
            for peer, key in (("haproxy", "mem_vs_haproxy"), ("nginx", "mem_vs_nginx")):
                other = by.get(f"{peer}-{kind}")
                ok = other is not None and other["status"] in OK
                e[key] = _ratio(e["memory"]["kib_per_conn"], other["memory"]["kib_per_conn"]) if ok else None


def _show(v):
    return "-" if v is None else str(v)


def _status(e):
    if e["status"] == "failed":
        return f"failed: {e['error']}"
    if e["status"] == "expected-miss":
        return f"expected-miss: {e['note']}"
    return e["status"] + (f" ({e['note']})" if e.get("note") else "")


def print_tables(settings, entries, out):
    w = max([23] + [len(e["peer"]) for e in entries])
    req = [e for e in entries if "rps" in e]
    if req:
        fmt = f"%-{w}s %9s %8s %8s %7s %9s %13s %6s %6s %8s %8s %8s %8s  %s\n"
        out.write("\n" + fmt % ("peer", "req/s", "p50 ms", "p99 ms", "errors", "CPU us/r", "CPU min-max",
                                "core%", "new-up", "be-sleep", "rps/hap", "cpu/hap", "paired", "status"))
        for e in req:
            rng = "-"
            if e["proxy_cpu_us_per_req_min"] is not None:
                rng = f"{e['proxy_cpu_us_per_req_min']}-{e['proxy_cpu_us_per_req_max']}"
            out.write(fmt % (e["peer"], _show(e["rps"]), _show(e["p50_ms"]), _show(e["p99_ms"]),
                             _show(e["errors_total"]), _show(e["proxy_cpu_us_per_req"]), rng,
                             _show(e["proxy_core_busy_pct"]), _show(e["new_upstream_conns"]),
                             _show(e["backend_sleeps_per_1k_req"]), _show(e["rps_vs_baseline"]),
                             _show(e["cpu_vs_baseline"]), _show(e["cpu_vs_baseline_paired"]), _status(e)))
        out.write(f"\nEach number is the median over {settings.rounds} round(s); the rounds ran interleaved (every row once per round).\n")
        out.write(f"req/s, p50/p99: the load tool (wrk: 1 thread, {settings.connections} conns; h2load: "
                  f"{settings.h2_connections} conns x {settings.h2_streams} streams; handshake rows: "
                  f"{settings.tls_clients} clients, one connection per request), {settings.duration}s after "
                  f"{settings.warmup}s warm-up. CPU us/r: proxy utime+stime per request (per connection in the "
                  "handshake rows); CPU min-max over the rounds.\n")
        out.write("core%: busy share of the proxy's core. new-up: upstream connections opened during the run "
                  "that carried requests (max over rounds).\n")
        out.write("be-sleep: times the backend nginx went to sleep per 1000 requests (each one a wake-up the "
                  "proxy paid for in its send): fewer means the proxy sends in bursts.\n")
        out.write("errors: sum over the rounds. rps/hap, cpu/hap: ratio of the medians to the row's HAProxy "
                  "row (haproxy-header for the short-request rows; see bench/README.md). paired: the median over "
                  "rounds of the per-round cpu/hap (drift between rounds cancels). direct has no proxy: "
                  "its new-up are wrk's own connections.\n")
        pairs = paired_ratios(entries)
        if pairs:
            out.write("Paired CPU ratios (median over rounds of the per-round ratio): "
                      + ", ".join(f"{k} {_show(v)}" for k, v in pairs.items()) + "\n")

    ups = [e for e in entries if (e.get("upstream") or {}).get("plain_row")]
    if ups:
        fmt = f"%-{w}s %-17s %8s %8s %9s %9s %8s %8s %8s %8s %10s\n"
        out.write("\nBackend TLS and HTTP/2 (the plain row: the same peer's *-header row of this run; medians over rounds)\n")
        out.write(fmt % ("peer", "backends saw", "req/s", "rps/plain", "CPU us/r", "+us/r", "cpu/plain",
                         "p99 ms", "plain p99", "cpu/hap", "TLS conns"))
        by = {e["peer"]: e for e in entries}
        for e in ups:
            up = e["upstream"]
            plain = by.get(up["plain_row"])
            seen = ",".join(sorted(up["protocols"])) or "-"
            conns = "-"
            if "tls_conns" in up:
                conns = f"{up['tls_conns']} ({up['tls_resumed']} r)"
            out.write(fmt % (e["peer"], seen, _show(e["rps"]), _show(up["rps_vs_plain"]),
                             _show(e["proxy_cpu_us_per_req"]), _show(up["cpu_added_us"]), _show(up["cpu_vs_plain"]),
                             _show(e["p99_ms"]), _show(plain["p99_ms"] if plain else None),
                             _show(e["cpu_vs_baseline"]), conns))
        out.write("backends saw: $server_protocol and $ssl_protocol of every request at the backend nginx. +us/r: CPU "
                  "us/r minus the plain row's. TLS conns: upstream TLS connections that carried requests from "
                  "start-up to the end of the run, summed over the rounds, (r) of them resumed a session. nginx "
                  "has no h2 row: it proxies HTTP/1.x only.\n")

    hs = [e for e in entries if e["kind"] == rows.HANDSHAKE]
    if hs:
        fmt = f"%-{w}s %9s %12s %9s %9s %8s\n"
        out.write("\nTLS handshakes (a new TLS 1.3 connection per request; medians over rounds)\n")
        out.write(fmt % ("peer", "conns/s", "CPU us/conn", "resumed%", "cpu/hap", "cipher"))
        for e in hs:
            out.write(fmt % (e["peer"], _show(e["rps"]), _show(e["proxy_cpu_us_per_req"]), _show(e.get("resumed_pct")),
                             _show(e["cpu_vs_baseline"]), _show((e["tls"] or {}).get("cipher"))))

    sse = [e for e in entries if e.get("sse_probe")]
    if sse:
        fmt = f"%-{w}s %10s %10s %11s %11s %10s %10s %15s\n"
        out.write(f"\nSSE answer latency, ms (bench/sse.lua: {settings.sse_connections} conns, {settings.sse_pause_ms} ms "
                  "pause between requests, run next to the mix load; medians over rounds)\n")
        out.write(fmt % ("peer", "proxy p50", "proxy p99", "direct p50", "direct p99", "added p50", "added p99",
                         "added p99 range"))
        for e in sse:
            p = e["sse_probe"]
            out.write(fmt % (e["peer"], _show(p["via_proxy_p50_ms"]), _show(p["via_proxy_p99_ms"]),
                             _show(p["direct_p50_ms"]), _show(p["direct_p99_ms"]), _show(p["added_p50_ms"]),
                             _show(p["added_p99_ms"]), f"{_show(p['added_p99_ms_min'])} to {_show(p['added_p99_ms_max'])}"))
        out.write("added = (through the proxy) - (straight to a backend), per round, for the same percentile: "
                  "the proxy's share of an SSE answer's latency.\n")
        if any(e["peer"].endswith("-awake") for e in sse):
            out.write("-awake rows: both cores held out of halt by an idle-class busy loop, so a packet never "
                      "waits for a halted vCPU to be woken by the host (bench/README.md).\n")

    held = [e for e in entries if "memory" in e]
    if held:
        fmt = f"%-{w}s %7s %7s %9s %9s %9s %8s %8s %9s %9s %9s %6s  %s\n"
        out.write("\nHeld connections: memory per open stream / idle keep-alive connection, event latency "
                  "(medians over rounds)\n")
        out.write(fmt % ("peer", "open", "open s", "RSS0 MiB", "RSS MiB", "KiB/conn", "mem/hap", "mem/ngx",
                         "proxy p99", "direct p99", "added p99", "errors", "status"))
        for e in held:
            m = e["memory"]
            ev = e.get("events") or {}
            mib = lambda b: None if b is None else round(b / 1048576, 1)
            out.write(fmt % (e["peer"], _show(m["opened"]), _show(m["open_s"]), _show(mib(m["rss_base_bytes"])),
                             _show(mib(m["rss_held_bytes"])), _show(m["kib_per_conn"]), _show(e.get("mem_vs_haproxy")),
                             _show(e.get("mem_vs_nginx")), _show(ev.get("via_proxy_p99_ms")),
                             _show(ev.get("direct_p99_ms")), _show(ev.get("added_p99_ms")),
                             _show(e["errors_total"]), _status(e)))
        out.write(f"open: connections open at once through the proxy (streams rows: {settings.streams} SSE streams "
                  f"plus {settings.direct_streams} straight to the backend; idle rows: {settings.idle_conns} "
                  "keep-alive connections after one request each). KiB/conn: (RSS with all open, after the "
                  f"{settings.duration}s hold) - (RSS before opening), over the connections. Event latency: "
                  f"{settings.event_rate} events/s on random streams, backend write to client read; "
                  "added = proxy - direct per round.\n")

    noisy = [f"{e['peer']} round {r['round']}: {r['other_processes_busy_pct']}%" for e in entries
             for r in e["rounds"] if (r.get("other_processes_busy_pct") or 0) > 10]
    if noisy:
        out.write("WARNING: other processes used more than 10% of the machine during: " + ", ".join(noisy) + "\n")


def write_json(path, settings, entries, extra_settings, versions, ok):
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ok": ok,
        "baseline": "haproxy-header",
        "aggregation": "per row: median over rounds of rps, p50_ms, p99_ms, proxy_cpu_us_per_req, "
                       "proxy_core_busy_pct, backend_cpu_us_per_req, load_core_busy_pct, memory and the SSE "
                       "numbers; max_ms, new_upstream_conns and proxy_threads are the max, errors_total the sum; "
                       "rps_vs_baseline/cpu_vs_baseline divide by the row named in baseline_row; "
                       "cpu_vs_baseline_paired and paired_cpu_ratios are medians over rounds of the per-round "
                       "ratio; every round's raw numbers are in rounds[]",
        "settings": {**settings.as_json(), **extra_settings},
        "versions": versions,
        "paired_cpu_ratios": paired_ratios(entries),
        "rows": entries,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
