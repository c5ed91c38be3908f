"""An MCP client (official Python SDK, mcp==2.3.0) that lists and calls tools in a loop while a
fleet is deployed under it, for the rolling-deploy test of mrtr-router
(tests/external/rolling_deploy.rs; the servers are versioned_server.py).

    python rolling_client.py URL --mode stateless|session [--max-seconds S] [--max-iterations N]

Each iteration lists the tools (one request), then at once calls one of the tools just listed,
rotating over them (delete_item is never called: it is destructive), with arguments built from
the input schema it just saw: a property whose schema accepts a string gets a string ("abc-7"),
else an integer. So `lookup` gets a string id exactly when the listed definition (version 2)
accepts one.

  --mode stateless   2026-07-28: every list and every call is a request of its own, without a
                     session (one SDK client, which keeps no state between requests).
  --mode session     the 2025 session protocol: the list in one session, the call in a fresh
                     one, as a client that reconnects between the two.

The loop ends when stdin reaches end of file (the test closes it), or at --max-seconds or
--max-iterations. Each call's answer is classified:

  ok               a result that is not an error
  unknown_tool     the SDK server's "Unknown tool: NAME" (an isError result)
  schema_rejected  the SDK's argument validation: "Error executing tool NAME: N validation
                   error(s) for NAMEArguments" (an isError result)
  other            anything else: another error result, a JSON-RPC error, a transport failure

The last stdout line is one JSON summary: the counts ("calls", "list_failures", "iterations"),
the calls by tool and by the version whose list preceded them ("by_tool"), which version each
list showed ("listed") and answered each good call ("served"), and the first refusals and other
failures with their unix-ms times ("refusals", "other_messages"), which the test lines up with
its deploy steps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

MODERN = "2026-07-28"
NEVER_CALLED = {"delete_item"}
KEPT_MESSAGES = 5  # of the "other" failures, the first few are kept for the report
KEPT_REFUSALS = 20  # of the "unknown_tool" and "schema_rejected" calls, the first few, with times


def describe(exc: BaseException) -> str:
    """The innermost real error, unwrapped from anyio/SDK exception groups; a JSON-RPC error
    with its code and data (the router's errors name their reason and backend there)."""
    while len(getattr(exc, "exceptions", ())) == 1:  # (Base)ExceptionGroup of one
        exc = exc.exceptions[0]
    error = getattr(exc, "error", None)
    if isinstance(error, types.ErrorData):
        return f"{type(exc).__name__}: {error.code} {error.message} {error.data}"
    return f"{type(exc).__name__}: {exc}"


def accepts_string(prop: dict[str, Any]) -> bool:
    """Whether a property's JSON schema accepts a string ("type" may be a list; "anyOf" too)."""
    kinds = prop.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return "string" in kinds or any(accepts_string(alt) for alt in prop.get("anyOf", []))


def arguments_for(tool: types.Tool, i: int) -> dict[str, Any]:
    """A value for each property of the tool's listed input schema."""
    props = tool.input_schema.get("properties", {})
    return {name: f"abc-{i}" if accepts_string(prop) else i for name, prop in props.items()}


def classify(result: types.CallToolResult) -> str:
    """ok, unknown_tool, schema_rejected or other, by the SDK server's own wording."""
    text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
    if not result.is_error:
        return "ok"
    if text.startswith("Unknown tool:"):
        return "unknown_tool"
    if text.startswith("Error executing tool") and "validation error" in text:
        return "schema_rejected"
    return "other"


class Loop:
    """The loop's state and counts."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.http = httpx2.AsyncClient(timeout=httpx2.Timeout(10.0, read=20.0))
        self.calls: Counter[str] = Counter()
        self.by_tool: dict[str, Counter[str]] = defaultdict(Counter)  # by tool and version listed
        self.listed: Counter[str] = Counter()  # which version's tools each list showed
        self.served: Counter[str] = Counter()  # which version answered each ok call
        self.iterations = 0
        self.list_failures = 0
        self.messages: list[str] = []
        self.refusals: list[dict[str, Any]] = []

    def client(self, mode: str) -> Client:
        # No response cache: every list must reach a backend through the router.
        return Client(streamable_http_client(self.args.url, http_client=self.http), mode=mode, cache=None)

    def note_other(self, message: str) -> None:
        if len(self.messages) < KEPT_MESSAGES:
            # With the time (unix ms, as the test's deploy steps): which step it followed.
            self.messages.append(f"{int(time.time() * 1000)} {message}")

    async def iteration(self, i: int, shared: Client | None) -> None:
        """One list and one call: on `shared` (stateless mode), else each in a session of its own."""
        try:
            if shared is None:
                async with self.client("legacy") as session:
                    tools = (await session.list_tools()).tools
            else:
                tools = (await shared.list_tools()).tools
        except Exception as exc:  # counted, and the loop goes on: a deploy is under way
            self.list_failures += 1
            self.note_other(f"list: {describe(exc)}")
            return
        listed = "v2" if any(t.name == "summarize" for t in tools) else "v1"
        self.listed[listed] += 1
        callable_tools = sorted((t for t in tools if t.name not in NEVER_CALLED), key=lambda t: t.name)
        tool = callable_tools[i % len(callable_tools)]
        args = arguments_for(tool, i)
        try:
            if shared is None:
                async with self.client("legacy") as session:
                    result = await session.call_tool(tool.name, args)
            else:
                result = await shared.call_tool(tool.name, args)
            verdict = classify(result)
            if verdict == "ok":
                text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
                self.served[text.partition(":")[0]] += 1
            elif verdict == "other":
                self.note_other(f"{tool.name}: {result.content}")
            elif len(self.refusals) < KEPT_REFUSALS:
                # With the time (unix ms, as the test's deploy steps): which step it followed.
                self.refusals.append({"at_ms": int(time.time() * 1000), "verdict": verdict, "tool": tool.name,
                                      "arguments": args, "listed": listed})
        except Exception as exc:  # a JSON-RPC error or a transport failure
            verdict = "other"
            self.note_other(f"{tool.name}({args}): {describe(exc)}")
        self.calls[verdict] += 1
        self.by_tool[f"{tool.name} after a {listed} list"][verdict] += 1

    async def run(self, stop: asyncio.Event) -> None:
        deadline = time.monotonic() + self.args.max_seconds

        async def loop(shared: Client | None) -> None:
            while not stop.is_set() and self.iterations < self.args.max_iterations and time.monotonic() < deadline:
                await self.iteration(self.iterations, shared)
                self.iterations += 1

        async with self.http:
            if self.args.mode == "stateless":
                # One SDK client for the whole loop: on 2026-07-28 it keeps no session, and each
                # list and each call is a request of its own.
                async with self.client(MODERN) as shared:
                    await loop(shared)
            else:
                await loop(None)

    def summary(self) -> dict[str, Any]:
        return {
            "mode": self.args.mode,
            "iterations": self.iterations,
            "list_failures": self.list_failures,
            "calls": {k: self.calls[k] for k in ("ok", "unknown_tool", "schema_rejected", "other")},
            "by_tool": {name: dict(c) for name, c in sorted(self.by_tool.items())},
            "listed": dict(self.listed),
            "served": dict(self.served),
            "other_messages": self.messages,
            "refusals": self.refusals,
        }


async def main_async(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def wait_for_eof() -> None:
        sys.stdin.read()  # returns at end of file: the test closed our stdin
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_for_eof, daemon=True).start()
    state = Loop(args)
    await state.run(stop)
    print(json.dumps(state.summary()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", help="MCP endpoint, e.g. http://127.0.0.1:8080/mcp")
    ap.add_argument("--mode", choices=("stateless", "session"), required=True)
    ap.add_argument("--max-seconds", type=float, default=120.0, help="stop after this long at the latest")
    ap.add_argument("--max-iterations", type=int, default=1_000_000, help="stop after this many iterations")
    args = ap.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
