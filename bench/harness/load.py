"""The load tools, each run pinned to the load cpus and bounded in time, each returning the same
shape of result, so the measuring flow does not care which tool ran:

    {"requests", "duration_s", "p50_ms", "p99_ms", "max_ms", "errors": {kind: n}, "extra": {...}}

- wrk with the Lua scripts in bench/ (mcp.lua, mix.lua, sse.lua, big.lua): HTTP/1.1, keep-alive
  or TLS keep-alive; the scripts print one BENCH_RESULT line.
- h2load: HTTP/2 clients, h2c or TLS with ALPN h2; percentiles from its per-request log.
- clients/tls_load.py: a new TLS connection per request, full or resumed handshakes.
- clients/sse_load.py: held streams and idle connections, driven in lock-step (StreamClient).
A tool that fails to run raises LoadError with its last output lines.
"""

import json
import math
import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from . import measure
from .procs import LineReader


class LoadError(Exception):
    pass


def _tail(text, n=3):
    return " ".join(" | ".join(text.strip().splitlines()[-n:]).split())[:300]


def _ms(us):
    return None if us is None else round(us / 1000.0, 3)


# --- wrk ----------------------------------------------------------------------------------------
def wrk_duration_arg(duration):
    """wrk's -d takes whole seconds only (1 or more: its scan_time knows s, m and h, and a 0 is
    refused). (the -d argument, when to interrupt it or None): a decimal duration runs with -d
    rounded up and is ended with SIGINT at `duration`, which wrk handles as the end of its run
    (its handler sets the flag its -d timer sets; the threads stop within 100 ms, at their next
    rate sample, and it reports as usual, the real run time in duration_us)."""
    if float(duration).is_integer():
        return f"-d{int(duration)}s", None
    return f"-d{max(1, math.ceil(duration))}s", duration


class Wrk:
    """One wrk process (1 thread): start() returns at once, so probes can run beside the load;
    result() waits (bounded) and parses the BENCH_RESULT line. With a decimal duration a thread
    of its own interrupts it on time (wrk_duration_arg), whether or not result() is waiting."""

    def __init__(self, ctx, url, script, args, duration, connections, out, authorization=None):
        self.ctx, self.duration, self.out = ctx, duration, Path(out)
        # mcp.lua sends it on every request (the [auth] rows).
        self.env = dict(os.environ, BENCH_AUTHORIZATION=authorization) if authorization else None
        d_arg, self.interrupt_after = wrk_duration_arg(duration)
        self.cmd = ["wrk", "-t1", f"-c{connections}", d_arg, "--timeout", "5s", "--latency",
                    "-s", str(script), url, "--", *map(str, args)]
        self.proc = None
        self.done = threading.Event()

    def start(self):
        self.proc = self.ctx.procs.spawn(self.cmd, cpus=self.ctx.s.load_cpus, log=self.out, env=self.env)
        if self.interrupt_after is not None:
            threading.Thread(target=self._interrupt, args=(time.monotonic() + self.interrupt_after,),
                             daemon=True).start()
        return self

    def _interrupt(self, at):
        """SIGINT at `at`, and again every 0.1 s until wrk is gone (one that came before wrk set
        its handler, in its first milliseconds, is ignored)."""
        if self.done.wait(max(0.0, at - time.monotonic())):
            return
        while not self.done.is_set() and self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                return
            self.done.wait(0.1)

    def result(self):
        try:
            rc = self.proc.wait(self.duration + 30)
        except subprocess.TimeoutExpired:
            self.done.set()
            self.ctx.procs.stop(self.proc)
            raise LoadError(f"wrk did not finish within {self.duration + 30}s")
        finally:
            self.done.set()
        self.ctx.procs.forget(self.proc)
        text = self.out.read_text(errors="replace")
        if rc != 0:
            raise LoadError(f"wrk exited {rc}: {_tail(text)}")
        m = re.search(r"^BENCH_RESULT (.*)$", text, re.M)
        if not m:
            raise LoadError(f"no BENCH_RESULT line from wrk: {_tail(text)}")
        v = {k: int(x) for k, x in (kv.split("=", 1) for kv in m.group(1).split())}
        errors = {k: v.get(k, 0) for k in ("connect", "read", "write", "status", "timeout", "misrouted")}
        if "bad" in v:
            errors["bad"] = v["bad"]
        dur = v["duration_us"] / 1e6
        return {
            "requests": v["requests"], "duration_s": round(dur, 3),
            "p50_ms": _ms(v["p50_us"]), "p99_ms": _ms(v["p99_us"]), "max_ms": _ms(v["max_us"]),
            "errors": errors,
            "extra": {"pending_calls": v.get("pending", 0), "confirmed_calls": v.get("confirmed", 0)},
        }


def wrk(ctx, url, script, args, duration, connections, out, authorization=None):
    return Wrk(ctx, url, script, args, duration, connections, out, authorization).start().result()


# --- h2load -------------------------------------------------------------------------------------
H2_BODY = (
    '{"jsonrpc":"2.0","id":1,"messageId":"%s","method":"tools/call",'
    '"params":{"name":"search-documents","arguments":{"query":"quarterly revenue by region",'
    '"limit":20,"filters":{"department":"finance","year":2026,"status":["final","approved"]},'
    '"fields":["title","author","updated","summary"]}}}'
)


def h2load_duration_arg(duration):
    """h2load's -D: whole seconds as before ("8"), a decimal duration in milliseconds ("300ms";
    it takes an integer with a unit, not "0.3")."""
    if float(duration).is_integer():
        return str(int(duration))
    return f"{round(duration * 1000)}ms"


def h2load(ctx, url, duration, out_dir, tag):
    """h2load, 1 thread, h2_connections x h2_streams, POSTing the ~300-byte tools/call of
    mcp.lua. h2load sends the same request every time, so one run has one key (a fresh one per
    run): every request of the run must reach the same backend, which the flow checks from the
    backend's log. Latency percentiles come from --log-file (one line per request)."""
    out_dir = Path(out_dir)
    key = "h2-%016x" % random.getrandbits(64)
    body = out_dir / f"{tag}-body.json"
    body.write_text(H2_BODY % key)
    logf = out_dir / f"{tag}-requests.log"
    out = out_dir / f"{tag}.out"
    s = ctx.s
    cmd = ["h2load", "-t", "1", "-c", str(s.h2_connections), "-m", str(s.h2_streams),
           "-D", h2load_duration_arg(duration), "--log-file", str(logf),
           "-H", "content-type: application/json", "-H", "accept: application/json, text/event-stream",
           "-H", f"mcp-routing-id: {key}", "-d", str(body), url]
    p = ctx.procs.spawn(cmd, cpus=s.load_cpus, log=out)
    try:
        rc = p.wait(duration + 30)
    except subprocess.TimeoutExpired:
        ctx.procs.stop(p)
        raise LoadError(f"h2load did not finish within {duration + 30}s")
    ctx.procs.forget(p)
    text = out.read_text(errors="replace")
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                  r"(\d+) errored, (\d+) timeout", text)
    sc = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
    fin = re.search(r"finished in ([0-9.]+)(us|ms|s),", text)
    if rc != 0 or not (m and sc and fin):
        raise LoadError(f"h2load exited {rc}: {_tail(text)}")
    _, _, done, ok, failed, errored, timeout = map(int, m.groups())
    dur = float(fin.group(1)) / {"us": 1e6, "ms": 1e3, "s": 1.0}[fin.group(2)]
    lat = []
    try:
        for line in logf.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 3 and parts[1].isdigit() and 200 <= int(parts[1]) < 400:
                lat.append(int(parts[2]))
    except OSError:
        pass
    return {
        "requests": ok, "duration_s": round(dur, 3),
        "p50_ms": _ms(measure.percentile(lat, 50)), "p99_ms": _ms(measure.percentile(lat, 99)),
        "max_ms": _ms(max(lat) if lat else None),
        # h2load counts a non-2xx/3xx answer as failed: status is its share of failed
        "errors": {"failed": failed, "errored": errored, "timeout": timeout},
        "extra": {"key": key, "status_4xx": int(sc.group(3)), "status_5xx": int(sc.group(4)), "done": done},
    }


# --- clients/tls_load.py --------------------------------------------------------------------------
def tls_handshakes(ctx, url, duration, resume, out):
    s = ctx.s
    script = s.bench_dir / "clients" / "tls_load.py"
    cmd = ["python3", str(script), "--url", url, "--duration", str(duration), "--clients", str(s.tls_clients)]
    if resume:
        cmd.append("--resume")
    p = ctx.procs.spawn(cmd, cpus=s.load_cpus, log=out)
    try:
        rc = p.wait(duration + 30)
    except subprocess.TimeoutExpired:
        ctx.procs.stop(p)
        raise LoadError(f"tls_load.py did not finish within {duration + 30}s")
    ctx.procs.forget(p)
    text = Path(out).read_text(errors="replace")
    m = re.search(r"^BENCH_RESULT (.*)$", text, re.M)
    if rc != 0 or not m:
        raise LoadError(f"tls_load.py exited {rc}: {_tail(text)}")
    v = json.loads(m.group(1))
    return {
        "requests": v["requests"], "duration_s": v["duration_s"], "p50_ms": v["p50_ms"],
        "p99_ms": v["p99_ms"], "max_ms": v["max_ms"], "errors": v["errors"],
        "extra": {"resumed": v["resumed"], "tls_versions": v["tls_versions"],
                  "first_error": v["first_error"], "stuck_threads": v["stuck_threads"]},
    }


# --- clients/sse_load.py --------------------------------------------------------------------------
class StreamClient:
    """sse_load.py in lock-step: warm() -> (harness samples the baseline) -> open() -> (holds,
    samples) -> close() -> result. Every step has a timeout; on any failure the process is
    stopped and LoadError raised."""

    def __init__(self, ctx, mode, proxy_port, direct_ports, count, out):
        s = ctx.s
        self.ctx = ctx
        script = s.bench_dir / "clients" / "sse_load.py"
        # A smoke run takes no memory figure it checks: fewer warm-up connections, and less
        # time for the proxy to see them closed before the baseline.
        cmd = ["python3", str(script), mode, "--proxy", f"127.0.0.1:{proxy_port}",
               "--concurrency", str(s.open_concurrency), "--warm", "20" if s.smoke else "50",
               "--settle", "0.02" if s.smoke else "0.2"]
        if mode == "streams":
            cmd += ["--streams", str(count), "--direct-streams", str(s.direct_streams),
                    "--direct", ",".join(f"127.0.0.1:{p}" for p in direct_ports)]
        else:
            cmd += ["--conns", str(count)]
        self.count = count
        self.out = Path(out)
        self.proc = ctx.procs.spawn(cmd, cpus=s.load_cpus, log=self.out, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE)
        self.lines = LineReader(self.proc.stdout)

    def _expect(self, tag, timeout):
        line = self.lines.readline(timeout)
        if line is None or not line.startswith(tag + " "):
            self.ctx.procs.stop(self.proc)
            what = "timed out" if line is None else f"said {line[:200]!r}"
            raise LoadError(f"sse_load.py {what} waiting for {tag}: {_tail(self.out.read_text(errors='replace'))}")
        return json.loads(line[len(tag) + 1:])

    def _send(self, word):
        try:
            self.proc.stdin.write(word.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as e:
            self.ctx.procs.stop(self.proc)
            raise LoadError(f"sse_load.py went away: {e}")

    def warm(self):
        return self._expect("WARMED", 60)

    def open(self):
        self._send("go")
        # the client gives up opening after 30 s + count/200 s; this is the backstop
        return self._expect("OPEN", 45 + (self.count + self.ctx.s.direct_streams) / 200)

    def close(self):
        self._send("close")
        v = self._expect("RESULT", 30)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.ctx.procs.stop(self.proc)
        return v
