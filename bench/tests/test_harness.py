"""Unit tests of the bench harness's own parts: the row table, every row's config rendered from
the templates (and checked by haproxy -c / nginx -t where they are installed), the settings'
compatibility with bench/run.sh's variables, the parsers of the load clients, and how wrk and h2load
get a decimal duration (one 0.3 s wrk against a server in the test). Runs in about two seconds,
starts no proxy:

    python3 -m unittest discover -s bench/tests
"""

import asyncio
import os
import shutil
import sys
import tempfile
import time
import unittest
from pathlib import Path
from unittest import mock

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "clients"))

from harness import load, measure, peers, report, rows, runner, settings  # noqa: E402
from harness.procs import Procs  # noqa: E402
import sse_load  # noqa: E402

OLD_ROWS = """direct mrtr-header mrtr-body mrtr-mix mrtr-mix-paced mrtr-mix-paced-awake mrtr-header-2w
haproxy-header haproxy-body haproxy-header-fwd haproxy-body-fwd haproxy-mix haproxy-mix-paced
haproxy-mix-paced-awake nginx-header hyper-floor""".split()


def load_settings(env=None, argv=()):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BENCH_")}
    clean.update(env or {})
    with mock.patch.dict(os.environ, clean, clear=True):
        return settings.load(list(argv))[0]


class Rows(unittest.TestCase):
    def test_every_row_of_bench_run_sh_is_kept_by_name(self):
        for name in OLD_ROWS:
            self.assertIn(name, rows.BY_NAME)
        self.assertEqual([r.name for r in rows.ROWS[:len(OLD_ROWS)]], OLD_ROWS)

    def test_names_unique_and_baselines_are_haproxy_rows(self):
        self.assertEqual(len(rows.BY_NAME), len(rows.ROWS))
        for r in rows.ROWS:
            self.assertIn(r.baseline, rows.BY_NAME, r.name)
            self.assertEqual(rows.BY_NAME[r.baseline].peer, rows.HAPROXY, r.name)
            if r.name not in OLD_ROWS:  # bench/run.sh divided every row by haproxy-header
                self.assertEqual(rows.BY_NAME[r.baseline].load, r.load, r.name)
                self.assertEqual(rows.BY_NAME[r.baseline].upstream, r.upstream, r.name)

    def test_upstream_rows(self):
        """Each upstream kind has a row per peer that speaks it (nginx: no h2), with the load of
        *-header, and names that peer's plain *-header row."""
        self.assertEqual(set(rows.UPSTREAMS), {r.upstream for r in rows.ROWS})
        got = sorted(r.name for r in rows.ROWS if r.upstream != rows.UP_H1)
        self.assertEqual(got, ["haproxy-upstream-h2", "haproxy-upstream-tls", "mrtr-upstream-h2",
                               "mrtr-upstream-tls", "nginx-upstream-tls"])
        for r in rows.ROWS:
            if r.upstream == rows.UP_H1:
                self.assertEqual(r.plain, "", r.name)
                continue
            plain = rows.BY_NAME[r.plain]
            self.assertEqual((plain.peer, plain.load, plain.key, plain.upstream, plain.tls, plain.h2),
                             (r.peer, r.load, r.key, rows.UP_H1, r.tls, r.h2), r.name)

    def test_auth_rows_are_mrtr_header_with_auth_on(self):
        got = [r for r in rows.ROWS if r.auth]
        self.assertEqual([r.name for r in got], ["mrtr-header-auth", "mrtr-header-auth-rs256"])
        plain = rows.BY_NAME["mrtr-header"]
        for r in got:
            self.assertEqual((r.peer, r.load, r.key, r.upstream, r.tls, r.h2, r.workers),
                             (plain.peer, plain.load, plain.key, plain.upstream, plain.tls, plain.h2, plain.workers), r.name)

    def test_select_names_and_patterns_in_the_order_given(self):
        got = [r.name for r in rows.select("nginx-header mrtr-tls-*,direct")]
        self.assertEqual(got, ["nginx-header", "mrtr-tls-header", "mrtr-tls-handshake", "mrtr-tls-resume", "direct"])
        with self.assertRaises(ValueError):
            rows.select("mrtr-header nope-*")


class Settings(unittest.TestCase):
    def test_bench_run_sh_variables(self):
        s = load_settings({"BENCH_SMOKE": "1", "BENCH_DURATION": "30", "BENCH_PEERS": "mrtr-header haproxy-header",
                           "BENCH_ROUTER_BIN": "target/debug/mrtr-router"})
        self.assertTrue(s.smoke and s.skip_build)
        self.assertEqual((s.rounds, s.duration, s.warmup, s.connections), (1, 0.3, 0, 8))  # smoke wins, as before
        self.assertEqual([r.name for r in s.rows], ["mrtr-header", "haproxy-header"])
        self.assertTrue(str(s.results).endswith("results/smoke.json"))
        full = load_settings({"BENCH_ROUNDS": "5"})
        self.assertEqual((full.rounds, full.duration, full.connections, full.nginx_keepalive), (5, 8, 64, 192))
        self.assertIn("rounds", full.explicit)

    def test_one_core_rows_put_the_proxy_on_the_load_cpus(self):
        s = load_settings({"BENCH_LOAD_CPUS": "0", "BENCH_PROXY_CPUS": "1", "BENCH_PROXY_CPUS_2W": "0-1"})
        self.assertEqual(s.proxy_cpus_for(rows.BY_NAME["mrtr-streams"]), "1")
        self.assertEqual(s.proxy_cpus_for(rows.BY_NAME["mrtr-header-2w"]), "0-1")
        for peer in ("mrtr", "haproxy", "nginx"):
            r = rows.BY_NAME[peer + "-streams-1core"]
            self.assertTrue(r.one_core and r.awake)
            self.assertEqual(s.proxy_cpus_for(r), "0")
            self.assertEqual(r.baseline, "haproxy-streams-1core")

    def test_flags_win_and_bad_values_are_setting_errors(self):
        s = load_settings({"BENCH_ROUNDS": "5"}, ["--rounds", "2", "--rows", "direct"])
        self.assertEqual(s.rounds, 2)
        for env in ({"BENCH_DURATION": "abc"}, {"BENCH_ROUNDS": "0"}, {"BENCH_PEERS": "nope"},
                    {"BENCH_PROXY_CPUS": "99"}, {"BENCH_SMOKE": "yes"}):
            with self.assertRaises(settings.SettingError, msg=str(env)):
                load_settings(env)

    def test_duration_in_decimal_seconds(self):
        """A whole duration stays an int (wrk -d8s, h2load -D 8, as before); a decimal one is a
        float; the smoke run's is 0.3 s unless a flag says otherwise."""
        self.assertEqual(load_settings({"BENCH_DURATION": "8"}).duration, 8)
        self.assertIsInstance(load_settings({"BENCH_DURATION": "8"}).duration, int)
        self.assertEqual(load_settings({"BENCH_DURATION": "2.0"}).duration, 2)
        self.assertEqual(load_settings({"BENCH_DURATION": "0.5"}).duration, 0.5)
        self.assertEqual(load_settings({}, ["--duration", "1.5"]).duration, 1.5)
        self.assertEqual(load_settings({"BENCH_SMOKE": "1", "BENCH_DURATION": "5"}).duration, 0.3)
        self.assertEqual(load_settings({"BENCH_SMOKE": "1"}, ["--duration", "1"]).duration, 1)
        for env in ({"BENCH_DURATION": "0"}, {"BENCH_DURATION": "0.0"}, {"BENCH_DURATION": "-1"},
                    {"BENCH_DURATION": ".5"}, {"BENCH_DURATION": "1e3"}):
            with self.assertRaises(settings.SettingError, msg=str(env)):
                load_settings(env)
        with mock.patch("sys.stderr"), self.assertRaises(SystemExit):
            load_settings({}, ["--duration", "0.3s"])


class Configs(unittest.TestCase):
    """Every row's config renders from its template with nothing left unfilled, and the peers
    themselves accept it."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="mrtr-bench-test."))
        self.peers = peers.Peers(load_settings(), Procs(), self.tmp, fd_limit=20000)
        # The [auth] rows' token comes from examples/bench_token.rs, built for a run (the smoke
        # run in scripts/test.sh mints real ones); here only the config is rendered.
        self.peers.bench_token = lambda alg: (self.tmp / f"jwks-{alg}.json", "not-a-token")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_every_row(self):
        have_openssl = shutil.which("openssl") is not None
        for r in rows.ROWS:
            if (r.tls or r.upstream == rows.UP_TLS) and not have_openssl:
                continue
            d = self.tmp / r.name
            d.mkdir()
            conf = self.peers.config(r, d)
            if conf is None:
                continue
            text = conf.read_text()
            self.assertNotIn("@{", text, r.name)
            text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")) + "\n"
            if r.peer == rows.HAPROXY:
                self.assertEqual("option http-buffer-request" in text, r.key == "body", r.name)
                self.assertEqual("tune.bufsize" in text, bool(r.bufsize), r.name)
                self.assertEqual("option http-no-delay" in text, r.load == rows.STREAMS, r.name)
            if r.peer == rows.ROUTER:
                self.assertEqual("tls_cert" in text, r.tls, r.name)
            # the upstream rows, and only they, speak TLS or HTTP/2 to the backends
            up_tls, up_h2 = r.upstream == rows.UP_TLS, r.upstream == rows.UP_H2C
            ports = self.peers.ports.upstream[r.upstream] if r.load != rows.STREAMS else self.peers.ports.sse
            for port in ports:
                self.assertIn(f"127.0.0.1:{port}", text, r.name)
            if r.peer == rows.ROUTER:
                self.assertEqual(text.count('url = "https://'), 3 if up_tls else 0, r.name)
                self.assertEqual(text.count('tls_server_name = "bench.test"'), 3 if up_tls else 0, r.name)
                self.assertEqual("tls_ca = " in text, up_tls, r.name)
                self.assertEqual("http2 = true" in text, up_h2, r.name)
            if r.peer == rows.HAPROXY:
                self.assertEqual(text.count(" ssl verify required ca-file "), 3 if up_tls else 0, r.name)
                self.assertEqual(text.count("verifyhost bench.test alpn http/1.1\n"), 3 if up_tls else 0, r.name)
                servers = [l for l in text.splitlines() if l.startswith("  server ")]
                self.assertEqual(sum(l.endswith(" proto h2") for l in servers), 3 if up_h2 else 0, r.name)
            if r.peer == rows.NGINX:
                self.assertEqual("proxy_pass https://mcp;" in text, up_tls, r.name)
                for line in ("proxy_ssl_verify on;", "proxy_ssl_name bench.test;", "proxy_ssl_server_name on;",
                             "proxy_ssl_session_reuse on;", "proxy_ssl_protocols TLSv1.2 TLSv1.3;"):
                    self.assertEqual(line in text, up_tls, (r.name, line))
            tool = {rows.HAPROXY: "haproxy", rows.NGINX: "nginx"}.get(r.peer)
            if tool and shutil.which(tool) or tool and os.path.exists(f"/usr/sbin/{tool}"):
                with mock.patch.dict(os.environ, {"PATH": os.environ["PATH"] + ":/usr/sbin"}):
                    self.peers.check_config(r, conf)

    def test_nginx_has_no_h2_upstream(self):
        row = rows.Row("nginx-upstream-h2", rows.NGINX, rows.MCP, "x", upstream=rows.UP_H2C)
        with self.assertRaises(peers.PeerError):
            self.peers.config(row, self.tmp)

    @unittest.skipUnless(shutil.which("openssl"), "needs openssl")
    def test_backend_certificate_verifies_for_bench_test_only(self):
        """The test CA verifies the backends' certificate for bench.test, and for no address (the
        proxies reach the backends by IP and must be told the name)."""
        import subprocess
        ca, cert, _ = self.peers.backend_ca()
        ok = subprocess.run(["openssl", "verify", "-CAfile", str(ca), "-verify_hostname", "bench.test",
                             "-purpose", "sslserver", str(cert)], capture_output=True)
        self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
        bad = subprocess.run(["openssl", "verify", "-CAfile", str(ca), "-verify_ip", "127.0.0.1", str(cert)],
                             capture_output=True)
        self.assertNotEqual(bad.returncode, 0)
        text = self.peers.backend_config(self.tmp).read_text()
        self.assertNotIn("@{", text)
        for port in self.peers.ports.backend_tls:
            self.assertIn(f"listen 127.0.0.1:{port} ssl;", text)
        for port in self.peers.ports.backend_h2c:
            self.assertIn(f"listen 127.0.0.1:{port} http2;", text)

    @unittest.skipUnless(shutil.which("openssl"), "needs openssl")
    def test_backend_access_log_flush(self):
        """The backends' access log is written every 100 ms, every 10 ms in a smoke run (which
        only waits for each row's closing probe to reach it); nginx -t accepts both."""
        smoke = peers.Peers(load_settings({"BENCH_SMOKE": "1"}), Procs(), self.tmp, fd_limit=20000)
        for p, flush in ((self.peers, "100ms"), (smoke, "10ms")):
            d = self.tmp / f"backend-{flush}"
            (d / "tmp").mkdir(parents=True)
            conf = p.backend_config(d)
            self.assertIn(f" bench buffer=256k flush={flush};\n", conf.read_text())
            if shutil.which("nginx"):
                p._nginx_check(d, conf)

    def test_old_rows_render_as_bench_run_sh_did(self):
        d = self.tmp / "h"
        d.mkdir()
        text = self.peers.config(rows.BY_NAME["haproxy-header-fwd"], d).read_text()
        for line in ("  nbthread 1", "  maxconn 4096", "  http-reuse always", "  bind 127.0.0.1:18081",
                     "  option forwardfor", "  balance hdr(Mcp-Routing-Id)", "  server b1 127.0.0.1:19001"):
            self.assertIn(line + "\n", text)
        d = self.tmp / "n"
        d.mkdir()
        text = self.peers.config(rows.BY_NAME["nginx-header"], d).read_text()
        self.assertIn("keepalive 192;", text)
        self.assertIn("worker_connections 8192;", text)


class LoadArgs(unittest.TestCase):
    def test_wrk_duration(self):
        """wrk takes whole seconds only: a decimal duration runs with -d rounded up and is
        interrupted (SIGINT) at the duration; a whole one is passed as before."""
        self.assertEqual(load.wrk_duration_arg(8), ("-d8s", None))
        self.assertEqual(load.wrk_duration_arg(1), ("-d1s", None))
        self.assertEqual(load.wrk_duration_arg(0.3), ("-d1s", 0.3))
        self.assertEqual(load.wrk_duration_arg(2.5), ("-d3s", 2.5))

    def test_h2load_duration(self):
        self.assertEqual(load.h2load_duration_arg(8), "8")
        self.assertEqual(load.h2load_duration_arg(0.3), "300ms")
        self.assertEqual(load.h2load_duration_arg(1.25), "1250ms")

    @unittest.skipUnless(shutil.which("wrk"), "wrk not installed")
    def test_wrk_interrupted_at_a_decimal_duration_reports_its_run(self):
        """A real wrk against a local server, 0.3 s: it ends well before its -d1s and still
        prints the script's BENCH_RESULT line with the requests it completed."""
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        tmp = Path(tempfile.mkdtemp(prefix="mrtr-bench-test."))
        try:
            ctx = mock.Mock()
            ctx.procs = Procs()
            ctx.s.load_cpus = None
            t0 = time.monotonic()
            res = load.wrk(ctx, f"http://127.0.0.1:{srv.server_address[1]}/mcp", BENCH / "mcp.lua",
                           ["header"], 0.3, 2, tmp / "wrk.out")
            took = time.monotonic() - t0
        finally:
            ctx.procs.stop_all()
            srv.shutdown()
            srv.server_close()
            shutil.rmtree(tmp, ignore_errors=True)
        self.assertLess(took, 0.9)
        self.assertGreater(res["requests"], 0)
        self.assertLess(res["duration_s"], 0.6)
        self.assertEqual(sum(res["errors"].values()), 0, res["errors"])


class SecondLook(unittest.TestCase):
    def test_only_a_short_smoke_row_that_completed_no_request(self):
        s = settings.load(["--smoke"])[0]
        self.assertLess(s.duration, runner.SECOND_LOOK_S)
        none = {"status": "failed", "error": runner.NO_REQUEST}
        self.assertTrue(runner.second_look(s, none))
        for other in ({"status": "failed", "error": "3 errors (status 3)"},
                      {"status": "failed", "error": "proxy process died during the run"},
                      {"status": "ok", "error": None}):
            self.assertFalse(runner.second_look(s, other), other)
        full = settings.load([])[0]
        self.assertFalse(runner.second_look(full, none))
        s.duration = runner.SECOND_LOOK_S
        self.assertFalse(runner.second_look(s, none))


class Measure(unittest.TestCase):
    def test_percentile_and_median(self):
        v = list(range(1, 101))
        self.assertEqual(measure.percentile(v, 50), 50)
        self.assertEqual(measure.percentile(v, 99), 99)
        self.assertEqual(measure.percentile([7], 99), 7)
        self.assertIsNone(measure.percentile([], 50))
        self.assertEqual(measure.median([3, None, 1, 2]), 2)
        self.assertEqual(measure.median([1, 2]), 1.5)

    def test_own_process_tree(self):
        self.assertIn(os.getpid(), measure.tree_pids(os.getpid()))
        self.assertGreater(measure.tree_rss_bytes(os.getpid()), 1 << 20)
        self.assertEqual(measure.expand_cpus("0-2,5"), [0, 1, 2, 5])

    def test_metrics_delta(self):
        before = 'mrtr_route_decisions_total{source="ring"} 10\nmrtr_pins_created_total{kind="call"} 1\n'
        after = ('# HELP x\nmrtr_route_decisions_total{source="ring"} 25\nmrtr_route_decisions_total{source="pin"} 3\n'
                 'mrtr_pins_created_total{kind="call"} 4\nmrtr_router_errors_total{reason="x"} 0\n')
        self.assertEqual(runner.metrics_delta(before, after),
                         {"route_decisions": {"ring": 15, "pin": 3}, "pins_created": 3,
                          "upstream_errors": 0, "router_errors": 0})
        self.assertIsNone(runner.metrics_delta("", "other 1\n"))


class Report(unittest.TestCase):
    @staticmethod
    def entry(name, cpus, failed=()):
        rounds = [{"round": i + 1, "status": "failed" if i + 1 in failed else "ok", "proxy_cpu_us_per_req": c}
                  for i, c in enumerate(cpus)]
        return {"peer": name, "rps": 1, "rounds": rounds}

    def test_paired_ratio_pairs_rounds_and_skips_failed_ones(self):
        # The VM slowed down in round 3 for both rows: the ratio of medians (12/10 = 1.2) sets
        # a's slow round against b's fast ones; the paired ratio does not.
        a = self.entry("a", [10, 12, 30])
        b = self.entry("b", [10, 10, 30])
        self.assertEqual(report.paired_ratio(a, b), 1.0)
        self.assertEqual(report._ratio(measure.median([10, 12, 30]), measure.median([10, 10, 30])), 1.2)
        # A round either row failed does not count.
        self.assertEqual(report.paired_ratio(self.entry("a", [10, 20, 30], failed=(2,)), b), 1.0)
        self.assertIsNone(report.paired_ratio(self.entry("a", [10], failed=(1,)), b))

    def test_paired_ratios_of_the_pairs_that_ran(self):
        got = report.paired_ratios([self.entry("mrtr-header", [12, 24]), self.entry("hyper-floor", [10, 20]),
                                    self.entry("mrtr-h2c", [1])])
        self.assertEqual(got, {"mrtr-header/hyper-floor": 1.2})


class BackendLog(unittest.TestCase):
    LOG = """\
7 19001 HTTP/1.1 - - - /probe?tag=old
9 19021 HTTP/1.1 TLSv1.3 TLS_AES_256_GCM_SHA384 . /mcp
10 19001 HTTP/1.1 - - - /probe?tag=t0
9 19021 HTTP/1.1 TLSv1.3 TLS_AES_256_GCM_SHA384 . /mcp
11 19022 HTTP/1.1 TLSv1.3 TLS_AES_256_GCM_SHA384 r /mcp
11 19022 HTTP/1.1 TLSv1.3 TLS_AES_256_GCM_SHA384 r /mcp
12 19023 HTTP/1.1 TLSv1.2 ECDHE-ECDSA-AES256-GCM-SHA384 . /mcp
13 19001 HTTP/1.1 - - - /mcp?sse-direct
14 19001 HTTP/1.1 - - - /probe?tag=t1
15 19021 HTTP/1.1 TLSv1.3 TLS_AES_256_GCM_SHA384 . /mcp
"""

    def test_window_new_connections_protocols_and_resumptions(self):
        st = runner.backend_log_stats(self.LOG, "t0", "t1", 10, 14)
        self.assertEqual(st["shares"], {"19021": 1, "19022": 2, "19023": 1})
        self.assertEqual(st["conns"], 2)  # 9 was open before the run: not new
        self.assertEqual(st["protocols"], {"HTTP/1.1 TLSv1.3": 3, "HTTP/1.1 TLSv1.2": 1})
        self.assertEqual(st["ciphers"], {"TLS_AES_256_GCM_SHA384": 3, "ECDHE-ECDSA-AES256-GCM-SHA384": 1})
        self.assertEqual((st["tls_conns"], st["tls_resumed"]), (2, 1))
        everything = runner.backend_log_stats(self.LOG, "old", "t1")
        self.assertEqual((everything["conns"], everything["tls_conns"], everything["tls_resumed"]), (3, 3, 1))

    def test_expected_protocols(self):
        self.assertEqual(set(runner.EXPECTED_UPSTREAM), set(rows.UPSTREAMS))
        self.assertEqual(runner.EXPECTED_UPSTREAM[rows.UP_H2C], "HTTP/2.0 -")


class FakeTransport:
    def __init__(self):
        self.closed = False

    def get_extra_info(self, name):
        return None

    def write(self, data):
        pass

    def close(self):
        self.closed = True


class SseClientParser(unittest.TestCase):
    """The streams client de-chunks and splits events however the bytes arrive."""

    @staticmethod
    def conn(key="s-1"):
        """A client connection, made inside a running loop (its ready future needs one)."""
        stats = sse_load.Stats()
        c = sse_load.Conn(stats, "streams", "proxy", "127.0.0.1", 1, key, 1)
        c.connection_made(FakeTransport())
        return c, stats

    @staticmethod
    def chunk(b):
        return b"%x\r\n%s\r\n" % (len(b), b)

    def stream(self, key, events):
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Bench-Backend: 19011\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        body = self.chunk(b'event: open\ndata: {"progressToken":"%s"}\n\n' % key.encode())
        for token, t in events:
            body += self.chunk(b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress",'
                               b'"params":{"progressToken":"%s","progress":1,"t":%d}}\n\n' % (token.encode(), t))
        return head + body

    def test_byte_by_byte(self):
        async def run():
            c, stats = self.conn()
            stats.measuring = True
            data = self.stream("s-1", [("s-1", 0), ("s-1", 0), ("s-2", 0)])
            for i in range(len(data)):
                c.data_received(data[i:i + 1])
            self.assertTrue(c.ready.done() and c.ready.result() is None)
            self.assertEqual(stats.events["proxy"], 2)
            self.assertEqual(stats.errors["misrouted"], 1)
            self.assertEqual(stats.backends, {"19011": 1})
        asyncio.run(run())

    def test_merged_chunks_and_not_sse(self):
        async def run():
            c, stats = self.conn()
            c.data_received(self.stream("s-1", [("s-1", 0)]) + b"0\r\n\r\n")
            self.assertEqual(stats.errors["closed"], 1)  # the stream ended while held
            c, stats = self.conn()
            c.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            self.assertEqual(c.ready.result()[0], "non_sse")
        asyncio.run(run())


if __name__ == "__main__":
    unittest.main()
