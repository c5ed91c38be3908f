"""MCP client (official Python SDK, mcp==2.3.0) that authorizes with the SDK's OAuth providers,
for the router's OAuth tests (tests/external/idp.rs) against the test authorization server
(tests/idp/server.mjs).

    python oauth_client.py URL client-credentials --client-id ID --client-secret S --issuer ISS [--call TOOL[:TEXT]]...
    python oauth_client.py URL authorization-code [--user bob] [--call TOOL[:TEXT]]...
    ... [--also ORIGIN] [--tasks] [--during-input TOOL[:TEXT]]

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
protocol (TEXT is sent as {"text": TEXT}, or as the arguments themselves when it is a JSON
object); a 403 insufficient_scope on one makes the SDK re-authorize with the union of the
scopes it held and the challenged one, then send the call again. Elicitations (input_required
rounds) are answered: transfers approved, the one-time code for amount A is otp-A.

For routers behind an L4 load balancer (tests/external/auth_stepup.rs):
  --also ORIGIN        every other request to URL's origin goes to ORIGIN instead, on its own
                       connections, with the same URL and Host (one public address, two replicas)
  --legacy             one legacy session (initialize, Mcp-Session-Id) carries every call
  --tasks              declares io.modelcontextprotocol/tasks: a task result is polled with
                       tasks/get until it ends; each poll's status and the serving instance
                       (server.py's "servedBy") are reported in the summary's "tasks"
  --during-input TOOL[:TEXT]  the first elicitation first makes this call on the same client,
                       so a step-up it needs happens between two rounds of the call asking

Prints one JSON line per call ({"call", "ok", "text" or "error"}) and, last, a summary:
{"mode", "ok", "failed", "authorizations": browser runs, "tokens": [claims of each access token
the SDK obtained, with the header's "kid"/"alg"], "http": {"METHOD path status": count},
"requests": [each request to URL's origin or ORIGIN, in order: {"to": "url"|"also", "method",
"mcp_method", "mcp_name" (the headers, else the body's method and params.name), "status",
"token": index into "tokens" or null, "request_state" and "session": params.requestState and
Mcp-Session-Id up to their first "." or null}],
"tasks": [with --tasks]}.
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

# client.py (beside this file) holds the tasks extension's client side.
from client import ANY, CreateTaskResult, GetTask, TaskIdParams, TasksClient, answer_elicitation

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
        self.access_tokens: list[str] = []

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens
        self.access_tokens.append(tokens.access_token)
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


class Balancer(httpx2.AsyncBaseTransport):
    """An L4 load balancer's view of two router replicas: requests to the public URL's origin go
    to it and to `also` in turn, each origin on its own connections, the URL and Host unchanged.
    Logs each such request (which origin, its MCP headers, the token it carried, its status)."""

    def __init__(self, public: str, also: str | None, storage: MemoryStorage) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.public = httpx2.URL(public)
        self.also = httpx2.URL(also) if also else None
        self.storage = storage
        self.sent = 0
        self.log: list[dict[str, Any]] = []

    def _is_public(self, url: httpx2.URL) -> bool:
        return (url.scheme, url.host, url.port) == (self.public.scheme, self.public.host, self.public.port)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not self._is_public(request.url):
            return await self.inner.handle_async_request(request)
        to = "also" if self.also is not None and self.sent % 2 == 1 else "url"
        self.sent += 1
        sent = request
        if to == "also":
            # A copy: the SDK sends the same request object again after a step-up.
            url = request.url.copy_with(scheme=self.also.scheme, host=self.also.host, port=self.also.port)
            sent = httpx2.Request(request.method, url, headers=request.headers, stream=request.stream,
                                  extensions=request.extensions)
        body = _json_body(request)
        params = body.get("params") if isinstance(body.get("params"), dict) else {}
        session = request.headers.get("mcp-session-id")
        # Legacy requests carry no Mcp-Method / Mcp-Name headers: the body says.
        entry = {"to": to, "method": request.method,
                 "mcp_method": request.headers.get("mcp-method") or body.get("method"),
                 "mcp_name": request.headers.get("mcp-name") or params.get("name"),
                 "token": self._token_index(request), "request_state": _prefix(params.get("requestState")),
                 "session": _prefix(session)}
        self.log.append(entry)
        response = await self.inner.handle_async_request(sent)
        entry["status"] = response.status_code
        return response

    def _token_index(self, request: httpx2.Request) -> int | None:
        auth = request.headers.get("authorization", "")
        token = auth.removeprefix("Bearer ")
        return self.storage.access_tokens.index(token) if token in self.storage.access_tokens else None

    async def aclose(self) -> None:
        await self.inner.aclose()


def _json_body(request: httpx2.Request) -> dict[str, Any]:
    try:
        body = json.loads(request.content)
    except Exception:  # a GET, a streamed or non-JSON body
        return {}
    return body if isinstance(body, dict) else {}


def _prefix(handle: Any) -> str | None:
    """A handle up to its first "." (a router's sealed one says "mrt2"), None without one."""
    return handle.split(".", 1)[0] if isinstance(handle, str) else None


class RecordingTasks(TasksClient):
    """The tasks extension's client (client.py) that records each task's sealed id and, per
    tasks/get, the status and the instance that answered (server.py's "servedBy")."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, Any]] = []

    async def resolve(self, created: CreateTaskResult, ctx: Any) -> types.CallToolResult:
        record: dict[str, Any] = {"task": created.task_id, "polls": []}
        self.seen.append(record)
        params = TaskIdParams(taskId=created.task_id)
        while True:  # bounded by the run's --timeout
            task = await ctx.session.send_request(GetTask(params=params), ANY)
            record["polls"].append({"status": task["status"], "served_by": task.get("servedBy")})
            if task["status"] == "completed":
                return types.CallToolResult.model_validate(task["result"])
            if task["status"] in ("failed", "cancelled"):
                return types.CallToolResult(content=[types.TextContent(type="text", text=task["status"])],
                                            is_error=True)
            await anyio.sleep((task.get("pollIntervalMs") or 100) / 1000)


def provider_for(args: argparse.Namespace, storage: MemoryStorage, browser: HeadlessBrowser) -> OAuthClientProvider:
    if args.mode == "client-credentials":
        return ClientCredentialsOAuthProvider(server_url=args.url, storage=storage, client_id=args.client_id,
                                              client_secret=args.client_secret, issuer=args.issuer)
    metadata = OAuthClientMetadata(client_name="mrtr oauth_client.py", redirect_uris=[REDIRECT_URI])
    return OAuthClientProvider(server_url=args.url, client_metadata=metadata, storage=storage,
                               redirect_handler=browser.redirect, callback_handler=browser.callback)


def arguments_of(text: str) -> dict[str, Any]:
    if text.startswith("{"):
        return json.loads(text)
    return {"text": text} if text else {}


async def call_tool(client: Client, call: str, failures: list[str]) -> None:
    """One --call: its line printed, its failure (if any) added to `failures`."""
    tool, _, text = call.partition(":")
    line: dict[str, Any] = {"call": call}
    try:
        result = await client.call_tool(tool, arguments_of(text))
        body = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
        line.update(ok=not result.is_error, text=body)
        if result.is_error:
            failures.append(f"{call}: tool error {body}")
    except Exception as exc:  # report the call, keep going with the next
        line.update(ok=False, error=describe(exc))
        failures.append(f"{call}: {describe(exc)}")
    print(json.dumps(line), flush=True)


async def run(args: argparse.Namespace, wire: Wire, storage: MemoryStorage, browser: HeadlessBrowser,
              balancer: Balancer, tasks: RecordingTasks | None) -> list[str]:
    http = httpx2.AsyncClient(auth=provider_for(args, storage, browser), timeout=httpx2.Timeout(30.0, read=60.0),
                              transport=balancer, event_hooks={"response": [wire.on_response]})
    failures: list[str] = []
    holder: list[Client] = []
    pending = [args.during_input] if args.during_input else []

    async def on_elicitation(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        while pending:  # the first elicitation only
            await call_tool(holder[0], pending.pop(), failures)
        return await answer_elicitation(Counter(), params)

    client = Client(streamable_http_client(args.url, http_client=http), mode="legacy" if args.legacy else MODERN,
                    elicitation_callback=on_elicitation, extensions=[tasks] if tasks else [])
    holder.append(client)
    async with http, browser.http, client:
        for call in args.call:
            await call_tool(client, call, failures)
    return failures


def describe(exc: BaseException) -> str:
    """The innermost real error, unwrapped from anyio/SDK exception groups."""
    while len(getattr(exc, "exceptions", ())) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


async def main_async(args: argparse.Namespace) -> int:
    wire, storage = Wire(), MemoryStorage()
    browser = HeadlessBrowser(args.user, wire.on_response)
    balancer = Balancer(args.url, args.also, storage)
    tasks = RecordingTasks() if args.tasks else None
    started = time.monotonic()
    try:
        with anyio.fail_after(args.timeout):
            failures = await run(args, wire, storage, browser, balancer, tasks)
    except TimeoutError:
        failures = [f"timed out after {args.timeout}s"]
    except Exception as exc:  # connect, discovery, registration, token: outside the per-call guard
        failures = [describe(exc)]
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    summary = {"mode": args.mode, "ok": len(args.call) - len(failures), "failed": len(failures),
               "authorizations": browser.runs, "tokens": storage.seen,
               "client_id": storage.client.client_id if storage.client else args.client_id,
               "seconds": round(time.monotonic() - started, 2), "http": dict(sorted(wire.seen.items())),
               "requests": balancer.log}
    if tasks is not None:
        summary["tasks"] = tasks.seen
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
    ap.add_argument("--also", default=None, metavar="ORIGIN",
                    help="every other request to URL's origin goes to this origin (two replicas behind one address)")
    ap.add_argument("--legacy", action="store_true",
                    help="one legacy session (initialize handshake, Mcp-Session-Id) instead of 2026-07-28 requests")
    ap.add_argument("--tasks", action="store_true", help="declare io.modelcontextprotocol/tasks and poll task results")
    ap.add_argument("--during-input", default=None, metavar="TOOL[:TEXT]",
                    help="a call made from the first elicitation, before that round is answered")
    args = ap.parse_args()
    if args.mode == "client-credentials" and not (args.client_id and args.client_secret and args.issuer):
        ap.error("client-credentials needs --client-id, --client-secret and --issuer")
    args.call = args.call or ["whoami", "write_note:hello"]
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
