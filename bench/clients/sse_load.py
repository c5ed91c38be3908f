#!/usr/bin/env python3
"""Load client of the streams and idle-connection rows: opens thousands of connections through a
proxy, holds them, and measures what an event takes to cross.

    sse_load.py streams --proxy 127.0.0.1:18080 --direct 127.0.0.1:19011 --streams 10000 ...
    sse_load.py idle    --proxy 127.0.0.1:18080 --conns 10000 ...

Why Python: wrk and h2load close or reuse their connections; neither holds 10,000 answers open
and reads events off them. asyncio with plain sockets does, in one process on one core: idle
connections cost it nothing (epoll), and at the bench's event rate (1,000/s) each event costs it
some 20-50 us, the same for an event that crossed the proxy as for one that came straight from
the backend. The proxy's added latency is the difference of the two distributions, so this
constant cost cancels; what it adds to the spread is bounded by the direct row's own p99, which
the report prints beside it.

streams: opens --direct-streams streams straight to the backend (X-Bench-Via: direct), then
--streams through the proxy (X-Bench-Via: proxy), --concurrency at a time. Each is a header-keyed
`tools/call` POST (Mcp-Routing-Id and messageId: a fresh key) that the backend answers with an
open `text/event-stream` (bench/clients/sse_backend.py). A stream counts as open once its
`200 text/event-stream` headers and its first `event: open` arrived. Each later event carries the
backend's CLOCK_MONOTONIC send time; its latency is the receive time minus that. An event whose
progressToken is not the stream's own counts as misrouted.

idle: opens --conns connections through the proxy, each sends one header-keyed POST (the bench
nginx backend answers JSON) and, once the answer is complete, stays open and idle: keep-alive
client connections, as browsers and SDK clients leave them.

Both first open and close --warm connections (the proxy's lazy set-up, out of the baseline), wait
--settle seconds for the proxy to see them closed, then talk to the harness on stdin/stdout in
lock-step, so it samples the proxy's memory at the right moments:
    -> WARMED {json}       <- go
    -> OPEN {json}         (all open: measuring starts)   <- close   (measuring ends)
    -> RESULT {json}       then exit.
Every wait is bounded (--open-timeout per connection, --open-deadline for all; the harness also
stops the process on its own, later timeout).
"""

import argparse
import asyncio
import json
import math
import os
import random
import socket
import sys
import time

ERROR_KINDS = ("connect", "timeout", "status", "non_sse", "closed", "misrouted", "bad_event")


class Stats:
    def __init__(self):
        self.errors = {k: 0 for k in ERROR_KINDS}
        self.first_error = None
        self.backends = {}
        self.latency_us = {"proxy": [], "direct": []}
        self.events = {"proxy": 0, "direct": 0}
        self.measuring = False

    def error(self, kind, detail=""):
        self.errors[kind] += 1
        if self.first_error is None:
            self.first_error = f"{kind}: {detail}"[:300]


class Conn(asyncio.Protocol):
    """One client connection: sends its request, reads the answer's head, then (streams) the
    chunked event stream or (idle) the body, and says on `ready` when it is open."""

    def __init__(self, stats, mode, via, host, port, key, seq):
        self.stats, self.mode, self.via = stats, mode, via
        self.key = key
        self.ready = asyncio.get_running_loop().create_future()
        self.transport = None
        self.buf = bytearray()
        self.head_done = False
        self.chunked = False
        self.length = None       # Content-Length of a plain answer
        self.chunk_left = 0      # bytes of the current chunk still to come
        self.chunk_state = "size"  # size | data | crlf | done
        self.events = bytearray()
        self.opened = False
        self.closing = False
        body = (
            '{"jsonrpc":"2.0","id":%d,"messageId":"%s","method":"tools/call",'
            '"params":{"name":"watch-progress","arguments":{"job":"%s"}}}' % (seq, key, key)
        ).encode()
        extra = f"X-Bench-Stream: {key}\r\nX-Bench-Via: {via}\r\n" if mode == "streams" else ""
        self.request = (
            f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nMcp-Routing-Id: {key}\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(self.request)

    def fail(self, kind, detail):
        """Before the connection is open: its outcome. After: one more error of the run. Only a
        misrouted or unreadable event leaves the connection open."""
        if not self.ready.done():
            self.ready.set_result((kind, detail))
        else:
            self.stats.error(kind, detail)
        if kind not in ("misrouted", "bad_event") and self.transport is not None:
            self.closing = True
            self.transport.close()

    def data_received(self, data):
        now = time.monotonic_ns()
        self.buf += data
        if not self.head_done:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            del self.buf[: end + 4]
            self.head_done = True
            status = head[0].split(" ", 2)
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if len(status) < 2 or status[1] != "200":
                return self.fail("status", head[0])
            backend = headers.get("x-bench-backend", "?")
            self.stats.backends[backend] = self.stats.backends.get(backend, 0) + 1
            self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            if "content-length" in headers:
                self.length = int(headers["content-length"])
            if self.mode == "streams":
                ctype = headers.get("content-type", "")
                if not ctype.lower().startswith("text/event-stream"):
                    return self.fail("non_sse", f"content-type {ctype!r}")
        self.body(now)

    def body(self, now):
        """Takes the payload out of self.buf: de-chunked, or up to Content-Length, or all."""
        if not self.chunked:
            if self.length is not None:
                take = min(self.length, len(self.buf))
                payload = bytes(self.buf[:take])
                del self.buf[:take]
                self.length -= take
                self.payload(payload, now, self.length == 0)
            else:
                payload = bytes(self.buf)
                self.buf.clear()
                self.payload(payload, now, False)
            return
        out = bytearray()
        complete = False
        while self.buf:
            if self.chunk_state == "size":
                i = self.buf.find(b"\r\n")
                if i < 0:
                    break
                try:
                    size = int(bytes(self.buf[:i]).split(b";")[0], 16)
                except ValueError:
                    return self.fail("bad_event", "bad chunk size")
                del self.buf[: i + 2]
                if size == 0:
                    self.chunk_state = "done"
                    complete = True
                    self.buf.clear()  # trailers: none expected
                    break
                self.chunk_left = size
                self.chunk_state = "data"
            elif self.chunk_state == "data":
                take = min(self.chunk_left, len(self.buf))
                out += self.buf[:take]
                del self.buf[:take]
                self.chunk_left -= take
                if self.chunk_left == 0:
                    self.chunk_state = "crlf"
            elif self.chunk_state == "crlf":
                if len(self.buf) < 2:
                    break
                del self.buf[:2]
                self.chunk_state = "size"
            else:
                self.buf.clear()
        self.payload(bytes(out), now, complete)

    def payload(self, data, now, complete):
        if self.mode == "idle":
            if complete and not self.ready.done():
                self.opened = True
                self.ready.set_result(None)
            return
        self.events += data
        while True:
            end = self.events.find(b"\n\n")
            if end < 0:
                break
            event = bytes(self.events[:end])
            del self.events[: end + 2]
            self.event(event, now)
        if complete:
            self.fail("closed", "the event stream ended")

    def event(self, raw, now):
        kind, data = "message", None
        for line in raw.split(b"\n"):
            if line.startswith(b"event:"):
                kind = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data = line[5:].strip()
        try:
            msg = json.loads(data) if data else None
        except ValueError:
            msg = None
        if kind == "open":
            if msg is None or msg.get("progressToken") != self.key:
                return self.fail("non_sse", f"first event is not this stream's open: {raw[:80]!r}")
            self.opened = True
            if not self.ready.done():
                self.ready.set_result(None)
            return
        if not self.opened:
            return self.fail("non_sse", f"an event before the open event: {raw[:80]!r}")
        try:
            params = msg["params"]
            token, sent = params["progressToken"], int(params["t"])
        except (TypeError, KeyError, ValueError):
            return self.fail("bad_event", repr(raw[:80]))
        if token != self.key:
            return self.fail("misrouted", f"stream {self.key} got the event of {token}")
        if self.stats.measuring:
            self.stats.events[self.via] += 1
            self.stats.latency_us[self.via].append((now - sent) / 1000.0)

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        if not self.ready.done():
            self.ready.set_result(("closed", f"connection closed before it was open ({exc})"))
        elif self.opened and not self.closing:
            self.stats.error("closed", f"{self.via} connection closed by the other side ({exc})")
        self.transport = None


async def open_many(stats, mode, via, addrs, n, concurrency, timeout, deadline, conns):
    """Opens n connections, round-robin over addrs, concurrency at a time, each within
    `timeout` s and all by `deadline` (loop time); appends the open ones to conns and counts the
    others' errors (past the deadline: timeout, without trying)."""
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(concurrency)

    async def one(i):
        host, port = addrs[i % len(addrs)]
        key = "s-%016x" % random.getrandbits(64)
        async with sem:
            left = min(timeout, deadline - loop.time())
            if left <= 0:
                stats.error("timeout", f"not opened by the deadline ({n} to open)")
                return
            c = Conn(stats, mode, via, host, port, key, i)
            try:
                await asyncio.wait_for(loop.create_connection(lambda: c, host, port), left)
            except (OSError, asyncio.TimeoutError) as e:
                stats.error("connect", f"{host}:{port}: {e!r}")
                return
            try:
                failed = await asyncio.wait_for(asyncio.shield(c.ready), left)
            except asyncio.TimeoutError:
                failed = ("timeout", f"not open after {left:.1f}s")
            if failed is not None:
                stats.error(*failed)
                if c.transport is not None:
                    c.closing = True
                    c.transport.close()
                return
            conns.append(c)

    await asyncio.gather(*(one(i) for i in range(n)))


def close_all(conns):
    for c in conns:
        c.closing = True
        if c.transport is not None:
            c.transport.close()
    conns.clear()


def pct(values, p):
    if not values:
        return None
    v = sorted(values)  # nearest rank
    k = max(0, min(len(v) - 1, math.ceil(p / 100.0 * len(v)) - 1))
    return round(v[k], 1)


def say(tag, obj):
    sys.stdout.write(f"{tag} {json.dumps(obj)}\n")
    sys.stdout.flush()


async def read_command(expected):
    """Waits for one line on stdin; EOF (the harness went away) ends the run."""
    loop = asyncio.get_running_loop()
    line = await loop.run_in_executor(None, sys.stdin.readline)
    if line.strip() != expected:
        raise SystemExit(f"sse_load: expected {expected!r} on stdin, got {line.strip()!r}")


def addr_list(s):
    out = []
    for part in s.split(","):
        host, _, port = part.rpartition(":")
        out.append((host, int(port)))
    return out


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("streams", "idle"))
    ap.add_argument("--proxy", required=True, help="host:port of the proxy")
    ap.add_argument("--direct", default="", help="host:port[,...] of the backends (streams)")
    ap.add_argument("--streams", type=int, default=10000)
    ap.add_argument("--direct-streams", type=int, default=100)
    ap.add_argument("--conns", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--warm", type=int, default=50)
    ap.add_argument("--settle", type=float, default=0.2,
                    help="s between closing the warm-up connections and WARMED (the memory baseline)")
    ap.add_argument("--open-timeout", type=float, default=10.0, help="s, per connection")
    ap.add_argument("--open-deadline", type=float, default=0.0,
                    help="s for all of them (default 30 + count/200)")
    a = ap.parse_args()
    stats = Stats()
    proxy = addr_list(a.proxy)
    n = a.streams if a.mode == "streams" else a.conns
    budget = a.open_deadline or 30.0 + (n + a.direct_streams) / 200.0
    loop = asyncio.get_running_loop()

    warm = []
    await open_many(stats, a.mode, "proxy", proxy, a.warm, a.concurrency, a.open_timeout,
                    loop.time() + 30.0, warm)
    warm_ok = len(warm)
    close_all(warm)
    await asyncio.sleep(a.settle)  # let the proxy see the closes before the baseline is taken
    say("WARMED", {"opened": warm_ok, "errors": dict(stats.errors)})
    await read_command("go")

    conns = []
    t0 = time.monotonic()
    deadline = loop.time() + budget
    direct_ok = 0
    if a.mode == "streams" and a.direct_streams > 0:
        await open_many(stats, a.mode, "direct", addr_list(a.direct), a.direct_streams,
                        a.concurrency, a.open_timeout, deadline, conns)
        direct_ok = len(conns)
    await open_many(stats, a.mode, "proxy", proxy, n, a.concurrency, a.open_timeout, deadline, conns)
    open_s = time.monotonic() - t0
    opened = len(conns) - direct_ok
    stats.measuring = True
    say("OPEN", {"opened": opened, "direct_opened": direct_ok, "open_s": round(open_s, 3),
                 "errors": dict(stats.errors), "first_error": stats.first_error})
    t1 = time.monotonic()
    await read_command("close")
    stats.measuring = False
    held_s = time.monotonic() - t1
    still_open = sum(1 for c in conns if c.transport is not None)
    close_all(conns)
    lat = {}
    for via, v in stats.latency_us.items():
        lat[via] = {"events": len(v), "p50_us": pct(v, 50), "p99_us": pct(v, 99),
                    "max_us": round(max(v), 1) if v else None}
    say("RESULT", {
        "mode": a.mode, "requested": n, "opened": opened, "direct_opened": direct_ok,
        "open_s": round(open_s, 3), "held_s": round(held_s, 3), "still_open": still_open,
        "errors": stats.errors, "first_error": stats.first_error, "backends": stats.backends,
        "latency": lat, "pid": os.getpid(),
    })


if __name__ == "__main__":
    asyncio.run(main())
