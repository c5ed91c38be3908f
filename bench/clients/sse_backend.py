#!/usr/bin/env python3
"""The SSE backend of the streams rows: holds thousands of open event streams and, now and then,
sends an event on one of them, stamped with the time it was written.

    sse_backend.py --host 127.0.0.1 --ports 19011,19012,19013 --rate 1000

Why a program of its own: the rows need a backend that keeps 10,000 slow `tools/call` answers
open at once (an MCP server streaming progress) and writes events whose crossing time a client
can measure. nginx cannot hold a response open and write to it later; a few dozen lines of
asyncio can, at no cost while the streams are idle.

A POST carrying `X-Bench-Stream: <id>` is answered `200 text/event-stream`, chunked, with one
`event: open` right away; the stream then stays open until the client closes it. Every
1/rate seconds one open stream, chosen at random, gets

    event: message
    data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"<id>","progress":<n>,"t":<ns>}}

where t is CLOCK_MONOTONIC (shared by every process of the machine) just before the write.
The streams are in two groups by `X-Bench-Via` (`proxy` or `direct`), and the events alternate
between the groups, so the latency through the proxy and straight to the backend are sampled
at the same rate whatever the number of streams in each. Every answer names its port in
`X-Bench-Backend`. A POST without `X-Bench-Stream` (the harness's readiness check) gets a small
JSON answer with Content-Length, keep-alive. Prints `READY` once it listens; exits on SIGTERM.
"""

import argparse
import asyncio
import json
import random
import signal
import socket
import time


class Group:
    """The open streams of one kind, in a list for an O(1) random choice and removal."""

    def __init__(self):
        self.items = []

    def add(self, s):
        s.slot = len(self.items)
        self.items.append(s)

    def remove(self, s):
        i = s.slot
        if i < 0:
            return
        last = self.items.pop()
        if last is not s:
            self.items[i] = last
            last.slot = i
        s.slot = -1


GROUPS = {"proxy": Group(), "direct": Group()}
READY_JSON = b'{"jsonrpc":"2.0","id":0,"result":{"content":[{"type":"text","text":"ok"}]}}'


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class Conn(asyncio.Protocol):
    """One client connection: requests until one turns into a held stream."""

    def __init__(self, port: int):
        self.port = port
        self.buf = bytearray()
        self.body_left = 0
        self.head = None
        self.transport = None
        self.stream_id = None
        self.group = None
        self.slot = -1
        self.events = 0

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data):
        if self.stream_id is not None:
            return  # a held stream: nothing more is expected from the client
        self.buf += data
        while True:
            if self.head is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > 65536:
                        self.transport.close()
                    return
                self.head = parse_head(bytes(self.buf[:end]))
                del self.buf[: end + 4]
                self.body_left = int(self.head.get("content-length", "0") or 0)
            take = min(self.body_left, len(self.buf))
            del self.buf[:take]
            self.body_left -= take
            if self.body_left > 0:
                return
            head, self.head = self.head, None
            self.answer(head)
            if self.stream_id is not None:
                return

    def answer(self, head):
        sid = head.get("x-bench-stream")
        port = str(self.port).encode()
        if not sid:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Bench-Backend: " + port
                + b"\r\nContent-Length: %d\r\n\r\n" % len(READY_JSON) + READY_JSON
            )
            return
        via = head.get("x-bench-via", "proxy")
        self.group = GROUPS["direct" if via == "direct" else "proxy"]
        self.stream_id = sid
        opened = b'event: open\ndata: {"progressToken":' + json.dumps(sid).encode() + b"}\n\n"
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"X-Bench-Backend: " + port + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(opened)
        )
        self.group.add(self)

    def send_event(self):
        self.events += 1
        token = json.dumps(self.stream_id)
        payload = (
            '{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":%s,'
            '"progress":%d,"t":%d}}' % (token, self.events, time.monotonic_ns())
        )
        self.transport.write(chunk(b"event: message\ndata: " + payload.encode() + b"\n\n"))

    def connection_lost(self, exc):
        if self.group is not None:
            self.group.remove(self)
            self.group = None


def parse_head(raw: bytes) -> dict:
    lines = raw.decode("latin-1").split("\r\n")
    head = {":request": lines[0]}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        head[name.strip().lower()] = value.strip()
    return head


async def events(rate: float):
    """One event every 1/rate s on a random open stream, alternating proxy and direct streams.
    Scheduled on absolute times, so a slow step does not lower the rate."""
    loop = asyncio.get_running_loop()
    period = 1.0 / rate
    turn = 0
    next_at = loop.time()
    order = (GROUPS["proxy"], GROUPS["direct"])
    while True:
        next_at += period
        delay = next_at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            next_at = loop.time()
        for k in range(2):
            g = order[(turn + k) % 2]
            if g.items:
                random.choice(g.items).send_event()
                break
        turn += 1


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--ports", required=True, help="comma-separated ports")
    ap.add_argument("--rate", type=float, default=1000.0, help="events per second, all streams")
    a = ap.parse_args()
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
    loop.add_signal_handler(signal.SIGINT, stop.set_result, None)
    servers = []
    for port in (int(p) for p in a.ports.split(",")):
        servers.append(
            await loop.create_server(lambda p=port: Conn(p), a.host, port, backlog=4096, reuse_address=True)
        )
    ticker = asyncio.ensure_future(events(a.rate))
    print("READY", flush=True)
    await stop
    ticker.cancel()
    for s in servers:
        s.close()


if __name__ == "__main__":
    asyncio.run(main())
