"""What each test server of tests/interop/ does once built: serve on its bound socket, and print
"READY <port>" (flushed) once uvicorn accepts connections, which the Rust tests wait for."""

import asyncio
import socket

import uvicorn


async def serve_saying_ready(server: uvicorn.Server, sock: socket.socket) -> None:
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if server.started:
        print(f"READY {sock.getsockname()[1]}", flush=True)
    await serving
