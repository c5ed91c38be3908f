"""An MCP server (official Python SDK, mcp==2.3.0) that is an OAuth resource server, for proving
tests/interop/oauth_client.py against the test authorization server (tests/idp/server.mjs)
without the router.

    python oauth_resource_server.py --port 0 --issuer http://127.0.0.1:PORT [--tool-scope write_note=files:write]
    -> prints "READY <port>" on stdout (flushed) once it accepts connections; exits when its
       stdin closes (so a test process that dies never leaves it behind).

Streamable HTTP at http://127.0.0.1:<port>/mcp, which is also its resource identifier (RFC 8707
audience). The SDK's own resource-server support does the protocol: a request without a valid
token gets 401 with `WWW-Authenticate: Bearer ... resource_metadata=...`, and the protected
resource metadata (RFC 9728) names --issuer and lists --required-scope. Tokens are checked by
`JwtVerifier` below: a JWT access token (RFC 9068, typ at+jwt) signed by a key of the issuer's
JWKS (found by discovery; an unknown kid re-fetches it), with iss = --issuer, aud = this
server's URL, not expired.

The SDK only enforces scopes for the whole endpoint. A tool named in --tool-scope NAME=SCOPE
additionally needs SCOPE: a tools/call of it (told by the Mcp-Method and Mcp-Name headers of the
2026-07-28 protocol) without it is refused with 403 and
`WWW-Authenticate: Bearer error="insufficient_scope", scope="SCOPE", resource_metadata=...`,
the challenge that makes a client step up.

Tools:
  whoami            -> JSON {"sub", "client_id", "scope", "aud", "iss"} of the token that called it
  write_note(text)  -> "<sub> wrote <text>"  (the tool the step-up tests guard with a scope)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
from typing import Any

import anyio
import httpx2
import jwt
import uvicorn
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import build_resource_metadata_url
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from pydantic import AnyHttpUrl
from starlette.types import ASGIApp, Receive, Scope, Send
from serving import serve_saying_ready  # tests/interop/serving.py, beside this file

ALGORITHMS = ["ES256", "RS256"]


class JwtVerifier:
    """The SDK's `TokenVerifier`: RFC 9068 JWT access tokens checked against the issuer's JWKS."""

    def __init__(self, issuer: str, jwks_uri: str, audience: str) -> None:
        self.issuer, self.audience = issuer, audience
        # PyJWKClient re-fetches the JWKS when a token names a kid it does not hold, by default
        # at most once per 30 s (a guard against tokens with made-up kids); the tests rotate
        # keys seconds apart, so here every unknown kid re-fetches.
        self.jwks = jwt.PyJWKClient(jwks_uri, cache_keys=True, lifespan=300, cooldown_duration=0)

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            if jwt.get_unverified_header(token).get("typ") != "at+jwt":
                raise jwt.InvalidTokenError("not an RFC 9068 access token (typ is not at+jwt)")
            key = await anyio.to_thread.run_sync(self.jwks.get_signing_key_from_jwt, token)
            claims = jwt.decode(token, key.key, algorithms=ALGORITHMS, audience=self.audience, issuer=self.issuer,
                                options={"require": ["exp", "iss", "aud", "sub", "client_id"]})
        except jwt.PyJWTError as exc:
            print(f"oauth_resource_server: token refused: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return None
        return AccessToken(token=token, client_id=claims["client_id"], scopes=claims.get("scope", "").split(),
                           expires_at=claims["exp"], resource=self.audience, subject=claims["sub"], claims=claims)


class ToolScopes:
    """ASGI middleware: 403 insufficient_scope for a tools/call of a tool whose scope the token lacks."""

    def __init__(self, app: ASGIApp, verifier: JwtVerifier, scopes: dict[str, str], metadata_url: str) -> None:
        self.app, self.verifier, self.scopes, self.metadata_url = app, verifier, scopes, metadata_url

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            needed = self.scopes.get(headers.get("mcp-name", "")) if headers.get("mcp-method") == "tools/call" else None
            bearer = headers.get("authorization", "")
            if needed and bearer.lower().startswith("bearer "):
                token = await self.verifier.verify_token(bearer[7:])
                # An invalid token is the SDK's to answer (401); only a valid one can lack a scope.
                if token is not None and needed not in token.scopes:
                    await self._refuse(send, needed)
                    return
        await self.app(scope, receive, send)

    async def _refuse(self, send: Send, needed: str) -> None:
        challenge = (f'Bearer error="insufficient_scope", scope="{needed}", '
                     f'resource_metadata="{self.metadata_url}", error_description="Required scope: {needed}"')
        body = json.dumps({"error": "insufficient_scope", "error_description": f"Required scope: {needed}"}).encode()
        await send({"type": "http.response.start", "status": 403, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", challenge.encode())]})
        await send({"type": "http.response.body", "body": body})


def build(issuer: str, resource: str, verifier: JwtVerifier, required: list[str]) -> MCPServer:
    # Strings, not AnyHttpUrl(...): AuthSettings keeps a path-less issuer without the trailing
    # slash a bare AnyHttpUrl adds, so the metadata's issuer compares equal (RFC 8414 §3.3).
    auth = AuthSettings(issuer_url=issuer, resource_server_url=resource, required_scopes=required,
                        validate_token_resource=True)
    mcp = MCPServer("mrtr-oauth-resource", token_verifier=verifier, auth=auth)

    def caller() -> dict[str, Any]:
        token = get_access_token()
        assert token is not None, "the SDK's RequireAuthMiddleware let an unauthenticated call through"
        return token.claims or {}

    @mcp.tool()
    def whoami() -> str:
        """The calling token's principal and grant."""
        claims = caller()
        return json.dumps({k: claims.get(k) for k in ("sub", "client_id", "scope", "aud", "iss")})

    @mcp.tool()
    def write_note(text: str) -> str:
        """Pretends to write a note; the tests guard it with a scope of its own."""
        return f"{caller()['sub']} wrote {text}"

    return mcp


async def serve(args: argparse.Namespace) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    resource = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    # The JWKS location comes from the authorization server's metadata (RFC 8414), as a
    # resource server configured with only an issuer finds it.
    async with httpx2.AsyncClient(timeout=10) as http:
        metadata = (await http.get(f"{args.issuer}/.well-known/oauth-authorization-server")).raise_for_status().json()
    if metadata["issuer"] != args.issuer:
        raise SystemExit(f"metadata names issuer {metadata['issuer']}, not {args.issuer}")
    verifier = JwtVerifier(args.issuer, metadata["jwks_uri"], resource)
    mcp = build(args.issuer, resource, verifier, args.required_scope)
    app = mcp.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    tool_scopes = dict(spec.split("=", 1) for spec in args.tool_scope)
    guarded = ToolScopes(app, verifier, tool_scopes, str(build_resource_metadata_url(AnyHttpUrl(resource))))
    server = uvicorn.Server(uvicorn.Config(guarded, log_level="warning", timeout_graceful_shutdown=2))
    await serve_saying_ready(server, sock)


def exit_when_stdin_closes() -> None:
    while sys.stdin.buffer.read(4096):
        pass
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0 = pick a free one)")
    ap.add_argument("--issuer", required=True, help="the authorization server's issuer URL")
    ap.add_argument("--required-scope", action="append", default=[],
                    help="scope every request needs; listed in the resource metadata (repeatable; default mcp:tools)")
    ap.add_argument("--tool-scope", action="append", default=[], metavar="TOOL=SCOPE",
                    help="a tool that needs one more scope (repeatable), e.g. write_note=files:write")
    args = ap.parse_args()
    args.required_scope = args.required_scope or ["mcp:tools"]
    threading.Thread(target=exit_when_stdin_closes, daemon=True).start()
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
