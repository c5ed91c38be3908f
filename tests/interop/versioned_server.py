"""One MCP server instance (official Python SDK, mcp==2.3.0) in version 1 or 2 of its tools, for
the rolling-deploy test of mrtr-router (tests/external/rolling_deploy.rs).

    python versioned_server.py --version 1 --port 0 --name v1-a
    python versioned_server.py --version 2 --port 0 --name v2-a --session-only
    -> prints "READY <port>" on stdout (flushed) once it accepts connections.

Streamable HTTP at http://127.0.0.1:<port>/mcp. Tools (each result names the instance and the
version, "v2:v2-a ..."):

  version 1                          version 2
  search(query: str)                 search(query: str), annotated readOnlyHint
  lookup(id: int)                    lookup(id: int | str): v1's arguments stay valid, but a
                                     string id is rejected by v1's argument validation
  delete_item(id: int), destructive  delete_item(id: int), destructive
                                     summarize(text: str): new

By default the SDK serves both protocols on one endpoint, chosen per request by the
MCP-Protocol-Version header: the 2025 session protocol (initialize, Mcp-Session-Id) and the
2026-07-28 stateless one. --session-only makes the instance a 2025 server: the SDK has no
setting that turns the 2026-07-28 protocol off (its session manager hands every request whose
MCP-Protocol-Version is not a handshake-era version to the modern handler, and
`stateless_http` only chooses whether 2025 sessions are kept), so a small ASGI wrapper answers
those requests as a 2025-only server (mcp 1.x) does: HTTP 400 with a JSON-RPC error naming the
versions it supports. Everything else, sessions included, is the SDK's own code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp_types import INVALID_REQUEST, ToolAnnotations
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from serving import serve_saying_ready  # tests/interop/serving.py, beside this file


def build(name: str, version: int) -> MCPServer:
    mcp = MCPServer("mrtr-rolling", instructions=f"instance {name}, tools version {version}")
    tag = f"v{version}:{name}"

    # v2 marks search read-only: the same tool in another definition (drift in the catalog).
    search_hints = ToolAnnotations(read_only_hint=True) if version >= 2 else None

    @mcp.tool(annotations=search_hints)
    def search(query: str) -> str:
        """Searches the items for `query`."""
        return f"{tag} search {query!r}"

    if version >= 2:

        @mcp.tool()
        def lookup(id: int | str) -> str:  # noqa: A002 (the argument's name is the schema's)
            """Looks an item up by its numeric id or its string key."""
            return f"{tag} lookup {id!r}"

        @mcp.tool()
        def summarize(text: str) -> str:
            """Summarizes `text` (new in version 2)."""
            return f"{tag} summary of {len(text)} characters"

    else:

        @mcp.tool()
        def lookup(id: int) -> str:  # noqa: A002
            """Looks an item up by its numeric id."""
            return f"{tag} lookup {id!r}"

    @mcp.tool(annotations=ToolAnnotations(destructive_hint=True))
    def delete_item(id: int) -> str:  # noqa: A002
        """Deletes an item (the rolling client never calls it: listed only)."""
        return f"{tag} deleted {id}"

    return mcp


def session_only(app: Any) -> Any:
    """Wraps the SDK's ASGI app: a request naming a protocol version that is not a 2025
    (handshake-era) one gets the answer a 2025-only server gives, so clients and the router's
    catalog fall back to an initialize'd session."""
    header = b"mcp-protocol-version"

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            version = next((v.decode("latin-1") for k, v in scope["headers"] if k == header), None)
            if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
                supported = ", ".join(HANDSHAKE_PROTOCOL_VERSIONS)
                body = json.dumps({
                    "jsonrpc": "2.0",
                    "id": "server-error",
                    "error": {
                        "code": INVALID_REQUEST,
                        "message": f"Bad Request: Unsupported protocol version: {version}. "
                                   f"Supported versions: {supported}",
                    },
                }).encode()
                await send({"type": "http.response.start", "status": 400,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return wrapped


async def serve(mcp: MCPServer, port: int, only_sessions: bool) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: uvicorn writes an answer's head and body apart, and
    # without it the body waits for the peer's delayed ACK (~40 ms) on every reused connection.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    app: Any = mcp.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    if only_sessions:
        app = session_only(app)
    # The wrapper is a plain ASGI callable: lifespan events pass through it to the SDK's app,
    # which starts its session manager on them.
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on"))
    await serve_saying_ready(server, sock)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", type=int, choices=(1, 2), required=True, help="which tools to serve")
    ap.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0 = pick a free one)")
    ap.add_argument("--name", required=True, help="instance name, in every result")
    ap.add_argument("--session-only", action="store_true",
                    help="serve only the 2025 session protocol (refuse 2026-07-28 requests)")
    args = ap.parse_args()
    try:
        asyncio.run(serve(build(args.name, args.version), args.port, args.session_only))
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
