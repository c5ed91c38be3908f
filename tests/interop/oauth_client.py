"""MCP client (official Python SDK, mcp==2.3.0) that authorizes with the SDK's OAuth providers,
for the router's OAuth tests (tests/idp.rs) against the test authorization server
(tests/idp/server.mjs).

    python oauth_client.py URL client-credentials --client-id ID --client-secret S --issuer ISS [--call TOOL[:TEXT]]...
    python oauth_client.py URL authorization-code [--user bob] [--call TOOL[:TEXT]]...

URL is an MCP endpoint that is an OAuth resource server (the router, or
tests/interop/oauth_resource_server.py). The SDK does all of OAuth: the first request gets 401,
then protected resource metadata, authorization server metadata, and
  client-credentials   ClientCredentialsOAuthProvider: a client_credentials token request with
                       the pre-registered client's secret (client_secret_basic)
  authorization-code   OAuthClientProvider: dynamic client registration, then authorization code
                       with PKCE; the "browser" is `HeadlessBrowser` below, which follows the
                       authorization URL with its own cookie jar through the authorization
                       server's scripted login and consent (as --user, sent as login_hint) and
                       takes the code from the redirect to the registered redirect_uri.
Each --call (default: whoami, then write_note:hello) is a tools/call over the 2026-07-28
protocol; a 403 insufficient_scope on one makes the SDK re-authorize with the union of the
scopes it held and the challenged one, then send the call again.

Prints one JSON line per call ({"call", "ok", "text" or "error"}) and, last, a summary:
{"mode", "ok", "failed", "authorizations": browser runs, "tokens": [claims of each access token
the SDK obtained, with the header's "kid"/"alg"], "http": {"METHOD path status": count}}.
Exit code non-zero if any call failed or the run timed out (--timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import sys
import time
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, urlencode, urljoin, urlparse

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

MODERN = "2026-07-28"
REDIRECT_URI = "http://127.0.0.1:1/callback"  # never contacted: the code is read off the redirect
MAX_HOPS = 10


def jwt_parts(token: str) -> dict[str, Any]:
    """Header fields kid/alg and the claims of a JWT, unverified (the resource server verifies)."""
    def part(b64: str) -> dict[str, Any]:
        return json.loads(base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)))
    header, claims, _ = token.split(".")
    head = part(header)
    return {**part(claims), "kid": head.get("kid"), "alg": head.get("alg")}


class MemoryStorage:
    """The SDK's `TokenStorage`, in memory; records every access token it is handed."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None
        self.seen: list[dict[str, Any]] = []

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens
        self.seen.append({**jwt_parts(tokens.access_token), "granted_scope": tokens.scope,
                          "refresh_token": tokens.refresh_token is not None})

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


class HeadlessBrowser:
    """The SDK's redirect and callback handlers without a person: GETs the authorization URL and
    each redirect (keeping cookies, as a browser does) until one leads to REDIRECT_URI."""

    def __init__(self, user: str | None, on_response: Any) -> None:
        self.user = user
        self.http = httpx2.AsyncClient(follow_redirects=False, timeout=20,
                                       event_hooks={"response": [on_response]})
        self.result: AuthorizationCodeResult | None = None
        self.runs = 0

    async def redirect(self, authorization_url: str) -> None:
        self.runs += 1
        url = authorization_url
        if self.user:  # the user "types their name": the scripted login signs in login_hint
            url += "&" + urlencode({"login_hint": self.user})
        for _ in range(MAX_HOPS):
            response = await self.http.get(url)
            location = response.headers.get("location")
            if not response.is_redirect or not location:
                raise RuntimeError(f"authorization stopped at {url}: {response.status_code} {response.text[:300]}")
            url = urljoin(url, location)
            if url.startswith(REDIRECT_URI):
                query = parse_qs(urlparse(url).query)
                if "error" in query:
                    raise RuntimeError(f"authorization refused: {query}")
                one = {k: v[0] for k, v in query.items()}
                self.result = AuthorizationCodeResult(code=one["code"], state=one.get("state"), iss=one.get("iss"))
                return
        raise RuntimeError(f"no redirect to {REDIRECT_URI} within {MAX_HOPS} hops")

    async def callback(self) -> AuthorizationCodeResult:
        result, self.result = self.result, None
        if result is None:
            raise RuntimeError("callback before the redirect produced a code")
        return result


class Wire:
    """Every HTTP exchange the run made (the SDK's and the browser's): "METHOD path status"."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def on_response(self, response: httpx2.Response) -> None:
        # Interaction ids (/auth/<uid>, /interaction/<uid>) collapse to {id} so counts add up.
        path = re.sub(r"^/(auth|interaction)/[^/]+$", r"/\1/{id}", response.request.url.path)
        self.seen[f"{response.request.method} {path} {response.status_code}"] += 1


def provider_for(args: argparse.Namespace, storage: MemoryStorage, browser: HeadlessBrowser) -> OAuthClientProvider:
    if args.mode == "client-credentials":
        return ClientCredentialsOAuthProvider(server_url=args.url, storage=storage, client_id=args.client_id,
                                              client_secret=args.client_secret, issuer=args.issuer)
    metadata = OAuthClientMetadata(client_name="mrtr oauth_client.py", redirect_uris=[REDIRECT_URI])
    return OAuthClientProvider(server_url=args.url, client_metadata=metadata, storage=storage,
                               redirect_handler=browser.redirect, callback_handler=browser.callback)


async def run(args: argparse.Namespace, wire: Wire, storage: MemoryStorage, browser: HeadlessBrowser) -> list[str]:
    http = httpx2.AsyncClient(auth=provider_for(args, storage, browser), timeout=httpx2.Timeout(30.0, read=60.0),
                              event_hooks={"response": [wire.on_response]})
    failures: list[str] = []
    async with http, browser.http, Client(streamable_http_client(args.url, http_client=http), mode=MODERN) as client:
        for call in args.call:
            tool, _, text = call.partition(":")
            line: dict[str, Any] = {"call": call}
            try:
                result = await client.call_tool(tool, {"text": text} if text else {})
                body = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
                line.update(ok=not result.is_error, text=body)
                if result.is_error:
                    failures.append(f"{call}: tool error {body}")
            except Exception as exc:  # report the call, keep going with the next
                line.update(ok=False, error=describe(exc))
                failures.append(f"{call}: {describe(exc)}")
            print(json.dumps(line), flush=True)
    return failures


def describe(exc: BaseException) -> str:
    """The innermost real error, unwrapped from anyio/SDK exception groups."""
    while len(getattr(exc, "exceptions", ())) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


async def main_async(args: argparse.Namespace) -> int:
    wire, storage = Wire(), MemoryStorage()
    browser = HeadlessBrowser(args.user, wire.on_response)
    started = time.monotonic()
    try:
        with anyio.fail_after(args.timeout):
            failures = await run(args, wire, storage, browser)
    except TimeoutError:
        failures = [f"timed out after {args.timeout}s"]
    except Exception as exc:  # connect, discovery, registration, token: outside the per-call guard
        failures = [describe(exc)]
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    summary = {"mode": args.mode, "ok": len(args.call) - len(failures), "failed": len(failures),
               "authorizations": browser.runs, "tokens": storage.seen,
               "client_id": storage.client.client_id if storage.client else args.client_id,
               "seconds": round(time.monotonic() - started, 2), "http": dict(sorted(wire.seen.items()))}
    if failures:
        summary["first_failure"] = failures[0][:500]
    print(json.dumps(summary), flush=True)
    return 1 if failures else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", help="MCP endpoint that is an OAuth resource server, e.g. http://127.0.0.1:8080/mcp")
    ap.add_argument("mode", choices=["client-credentials", "authorization-code"])
    ap.add_argument("--client-id", help="client-credentials: the pre-registered client")
    ap.add_argument("--client-secret", help="client-credentials: its secret")
    ap.add_argument("--issuer", help="client-credentials: the authorization server that issued the client")
    ap.add_argument("--user", default=None, help="authorization-code: the end-user to sign in (login_hint)")
    ap.add_argument("--call", action="append", default=[], metavar="TOOL[:TEXT]",
                    help="a tools/call, in order (repeatable; default whoami, then write_note:hello)")
    ap.add_argument("--timeout", type=float, default=90.0, help="whole-run deadline in seconds")
    args = ap.parse_args()
    if args.mode == "client-credentials" and not (args.client_id and args.client_secret and args.issuer):
        ap.error("client-credentials needs --client-id, --client-secret and --issuer")
    args.call = args.call or ["whoami", "write_note:hello"]
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
