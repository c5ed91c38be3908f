#!/usr/bin/env python3
"""Load client of the TLS handshake rows: one new TLS 1.3 connection per request, with a full
handshake every time or resuming the previous session.

    tls_load.py --url https://127.0.0.1:18080/mcp --duration 8 --clients 8 [--resume]

Why Python: wrk opens a new connection for each request when the answer says
`Connection: close`, but it never offers a session to resume, so it can run the full-handshake
row only; h2load keeps its connections. Python's ssl module (OpenSSL, the same library as wrk
and h2load) does both: `wrap_socket(session=...)` offers the session the previous connection got
(the TLS 1.3 ticket, read with the answer), and `session_reused` tells whether the server
accepted it. The handshake itself runs in OpenSSL, outside the GIL, so --clients threads keep the
proxy busy; the client's own speed only sets the rate, and the proxy's CPU is measured per
connection.

Each connection: TCP connect, TLS 1.3 handshake (the client allows nothing older; no ALPN, so
HTTP/1.1), one header-keyed `tools/call` POST with `Connection: close` and a fresh key, the
whole answer read to the server's close. The certificate is not verified (the harness made it a
second ago); the handshake is the same. Prints one line at the end:
    BENCH_RESULT {"requests": N, "resumed": N, "duration_s": S, "p50_ms": ..., "errors": {...}}
latency = connect to the end of the answer.
"""

import argparse
import json
import math
import random
import socket
import ssl
import sys
import threading
import time
import urllib.parse

BODY = (
    '{"jsonrpc":"2.0","id":%d,"messageId":"%s","method":"tools/call",'
    '"params":{"name":"search-documents","arguments":{"query":"quarterly revenue by region",'
    '"limit":20,"filters":{"department":"finance","year":2026,"status":["final","approved"]},'
    '"fields":["title","author","updated","summary"]}}}'
)
ERROR_KINDS = ("connect", "tls", "read", "status", "timeout")


class Worker(threading.Thread):
    def __init__(self, ctx, host, port, path, deadline, resume, timeout):
        super().__init__(daemon=True)
        self.ctx, self.host, self.port, self.path = ctx, host, port, path
        self.deadline, self.resume, self.timeout = deadline, resume, timeout
        self.latency_ms = []
        self.resumed = 0
        self.errors = {k: 0 for k in ERROR_KINDS}
        self.first_error = None
        self.versions = set()

    def error(self, kind, detail):
        self.errors[kind] += 1
        if self.first_error is None:
            self.first_error = f"{kind}: {detail}"[:300]

    def run(self):
        session = None
        seq = 0
        while time.monotonic() < self.deadline:
            seq += 1
            key = "t-%016x" % random.getrandbits(64)
            body = (BODY % (seq, key)).encode()
            req = (
                f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                f"Mcp-Routing-Id: {key}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            t0 = time.monotonic()
            try:
                raw = socket.create_connection((self.host, self.port), timeout=self.timeout)
            except socket.timeout:
                self.error("timeout", "connect")
                continue
            except OSError as e:
                self.error("connect", repr(e))
                time.sleep(0.01)
                continue
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                s = self.ctx.wrap_socket(raw, server_hostname="localhost",
                                         session=session if self.resume else None)
            except socket.timeout:
                self.error("timeout", "handshake")
                raw.close()
                continue
            except (ssl.SSLError, OSError) as e:
                self.error("tls", repr(e))
                raw.close()
                continue
            try:
                s.sendall(req)
                chunks = []
                while True:
                    b = s.recv(65536)
                    if not b:
                        break
                    chunks.append(b)
                answer = b"".join(chunks)
            except socket.timeout:
                self.error("timeout", "answer")
                s.close()
                continue
            except (ssl.SSLError, OSError) as e:
                self.error("read", repr(e))
                s.close()
                continue
            elapsed = time.monotonic() - t0
            self.versions.add(s.version())
            if s.session_reused:
                self.resumed += 1
            if self.resume:
                session = s.session
            s.close()
            status = answer.split(b"\r\n", 1)[0]
            if not status.startswith(b"HTTP/1.1 200"):
                self.error("status", status.decode("latin-1")[:100] or "empty answer")
                continue
            self.latency_ms.append(elapsed * 1000.0)


def pct(v, p):
    if not v:
        return None
    k = max(0, min(len(v) - 1, math.ceil(p / 100.0 * len(v)) - 1))
    return round(v[k], 3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--timeout", type=float, default=5.0)
    a = ap.parse_args()
    u = urllib.parse.urlsplit(a.url)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    t0 = time.monotonic()
    deadline = t0 + a.duration
    workers = [Worker(ctx, u.hostname, u.port, u.path or "/", deadline, a.resume, a.timeout)
               for _ in range(a.clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(a.duration + 3 * a.timeout + 5)
    duration = time.monotonic() - t0
    lat = sorted(x for w in workers for x in w.latency_ms)
    errors = {k: sum(w.errors[k] for w in workers) for k in ERROR_KINDS}
    first = next((w.first_error for w in workers if w.first_error), None)
    out = {
        "requests": len(lat), "resumed": sum(w.resumed for w in workers),
        "duration_s": round(duration, 3), "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
        "max_ms": round(lat[-1], 3) if lat else None, "errors": errors, "first_error": first,
        "tls_versions": sorted(set().union(*(w.versions for w in workers))),
        "stuck_threads": sum(1 for w in workers if w.is_alive()),
    }
    sys.stdout.write("BENCH_RESULT " + json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
