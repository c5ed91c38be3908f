"""MCP client scenarios (official Python SDK, mcp==2.3.0) for the mrtr-router interop tests.

    python client.py URL SCENARIO [options]        e.g.  python client.py http://127.0.0.1:8080/mcp multiround --calls 30

URL is the router's (or one server.py's) Streamable HTTP endpoint. Scenarios:
  whoami      --calls N            2026-07-28 single-round calls; reports which instances answered
  multiround  --calls N            N concurrent confirm_transfer calls, 2026-07-28: each needs two
                                   input_required rounds (requestState echoed on every retry)
  sessions    --sessions S --calls N   S concurrent legacy sessions (initialize handshake,
                                   Mcp-Session-Id); each calls counter N times and must see
                                   "<one instance>:1" .. ":N"
  elicitation --calls N            N concurrent legacy sessions; confirm_transfer asks two
                                   elicitation/create requests on the POST's SSE stream
  progress    --calls N [--legacy] progress_steps: every progress notification must arrive
                                   (over SSE) before the final result
  session_quota --calls N          one legacy session under a router rate quota: confirm_transfer,
                                   and while its first elicitation is open, whoami until the rate
                                   refuses one (at most N); then the elicitations are answered and
                                   the transfer must complete
  task        --calls N            slow_task as an io.modelcontextprotocol/tasks task (2026-07-28):
                                   resultType "task", poll tasks/get until "completed"; plus one
                                   task cancelled with tasks/cancel

The last stdout line is a JSON summary {"scenario":..., "ok":N, "failed":M, ...}; the exit code is
non-zero if any call failed or the scenario timed out (--timeout, default 120 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections import Counter
from typing import Any, ClassVar, Literal

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from pydantic import Field, TypeAdapter

MODERN = "2026-07-28"


class Wire:
    """What the HTTP layer saw (via httpx2 event hooks): statuses and content types per method."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def on_response(self, response: httpx2.Response) -> None:
        req = response.request
        method = req.headers.get("mcp-method") or req.method
        ctype = response.headers.get("content-type", "-").split(";")[0]
        self.seen[f"{req.method} {method} {response.status_code} {ctype}"] += 1


def connect(args: argparse.Namespace, wire: Wire, mode: str, **kwargs: Any) -> tuple[Client, httpx2.AsyncClient]:
    headers = dict(h.split(":", 1) for h in args.header)
    http = httpx2.AsyncClient(
        headers={k.strip(): v.strip() for k, v in headers.items()},
        timeout=httpx2.Timeout(30.0, read=90.0),
        # --no-keepalive: a new connection per request, so an L4 balancer in front of several
        # router replicas sends consecutive rounds to different replicas.
        limits=httpx2.Limits(max_connections=200, max_keepalive_connections=0 if args.no_keepalive else 50),
        event_hooks={"response": [wire.on_response]},
    )
    return Client(streamable_http_client(args.url, http_client=http), mode=mode, **kwargs), http


def text_of(result: types.CallToolResult) -> str:
    if result.is_error:
        raise RuntimeError(f"tool error: {result.content}")
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def answer_elicitation(counts: Counter[int], params: types.ElicitRequestParams) -> types.ElicitResult:
    """Approve every transfer; the one-time code for amount A is otp-A (checked in the result)."""
    amount = int(re.search(r"(\d+)", params.message).group(1))
    counts[amount] += 1
    if params.message.startswith("Approve"):
        return types.ElicitResult(action="accept", content={"approved": True})
    return types.ElicitResult(action="accept", content={"code": f"otp-{amount}"})


# ---- scenarios: each returns (ok, failures, extra summary fields) ----------------------------


def describe(exc: BaseException) -> str:
    """The innermost real error, unwrapped from anyio/SDK exception groups."""
    while len(getattr(exc, "exceptions", ())) == 1:  # (Base)ExceptionGroup of one
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


async def run_calls(n: int, one: Any) -> tuple[list[Any], list[str]]:
    """Run one(i) for i in 0..n-1 concurrently; collect results and failure messages."""
    results: list[Any] = []
    failures: list[str] = []

    async def guarded(i: int) -> None:
        try:
            results.append(await one(i))
        except Exception as exc:  # report every failure, keep the others running
            failures.append(f"call {i}: {describe(exc)}")

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(guarded, i)
    return results, failures


async def scenario_whoami(args: argparse.Namespace, wire: Wire) -> tuple[int, list[str], dict[str, Any]]:
    client, http = connect(args, wire, MODERN)
    async with http, client:
        results, failures = await run_calls(args.calls, lambda i: client.call_tool("whoami"))
    names = [text_of(r) for r in results]
    return len(names), failures, {"instances": dict(Counter(names))}


async def scenario_multiround(args: argparse.Namespace, wire: Wire) -> tuple[int, list[str], dict[str, Any]]:
    asked: Counter[int] = Counter()
    client, http = connect(args, wire, MODERN,
                           elicitation_callback=lambda ctx, params: answer_elicitation(asked, params))

    async def one(i: int) -> str:
        amount = 1000 + i
        text = text_of(await client.call_tool("confirm_transfer", {"amount": amount}))
        inst, _, rest = text.partition(":")
        if rest != f"transferred {amount} code=otp-{amount}" or asked[amount] != 2:
            raise RuntimeError(f"unexpected {text!r} after {asked[amount]} input rounds")
        return inst

    async with http, client:
        insts, failures = await run_calls(args.calls, one)
    return len(insts), failures, {"instances": dict(Counter(insts)), "rounds_per_call": 3}


async def scenario_sessions(args: argparse.Namespace, wire: Wire) -> tuple[int, list[str], dict[str, Any]]:
    async def one(i: int) -> str:
        client, http = connect(args, wire, "legacy")
        async with http, client:
            got = [text_of(await client.call_tool("counter")) for _ in range(args.calls)]
        inst = got[0].partition(":")[0]
        if got != [f"{inst}:{k}" for k in range(1, args.calls + 1)]:
            raise RuntimeError(f"session {i} saw {got}")
        return inst

    insts, failures = await run_calls(args.sessions, one)
    return len(insts), failures, {"instances": dict(Counter(insts)), "calls_per_session": args.calls}


async def scenario_elicitation(args: argparse.Namespace, wire: Wire) -> tuple[int, list[str], dict[str, Any]]:
    asked: Counter[int] = Counter()

    async def one(i: int) -> str:
        amount = 2000 + i
        client, http = connect(args, wire, "legacy",
                               elicitation_callback=lambda ctx, params: answer_elicitation(asked, params))
        async with http, client:
            text = text_of(await client.call_tool("confirm_transfer", {"amount": amount}))
        inst, _, rest = text.partition(":")
        if rest != f"transferred {amount} code=otp-{amount}" or asked[amount] != 2:
            raise RuntimeError(f"unexpected {text!r} after {asked[amount]} elicitations")
        return inst

    insts, failures = await run_calls(args.calls, one)
    return len(insts), failures, {"instances": dict(Counter(insts))}


async def scenario_session_quota(args: argparse.Namespace, wire: Wire) -> tuple[int, list[str], dict[str, Any]]:
    """A new call inside a session meets the rate; the answers to a call's elicitations do not."""
    asked: Counter[int] = Counter()
    spent = {"whoami_ok": 0, "refused": False, "refusal": ""}
    client: Client | None = None

    async def spend_the_rate() -> None:
        assert client is not None
        for _ in range(args.calls):
            try:
                text_of(await client.call_tool("whoami"))
                spent["whoami_ok"] += 1
            except Exception as exc:
                spent["refused"], spent["refusal"] = True, describe(exc)[:200]
                return

    async def on_elicit(params: types.ElicitRequestParams) -> types.ElicitResult:
        if not asked:
            await spend_the_rate()
        return await answer_elicitation(asked, params)

    client, http = connect(args, wire, "legacy", elicitation_callback=lambda ctx, params: on_elicit(params))
    amount = 3000
    async with http, client:
        text = text_of(await client.call_tool("confirm_transfer", {"amount": amount}))
    rest = text.partition(":")[2]
    failures = []
    if rest != f"transferred {amount} code=otp-{amount}" or asked[amount] != 2:
        failures.append(f"unexpected {text!r} after {asked[amount]} elicitations")
    refused_429 = sum(n for k, n in wire.seen.items() if " 429 " in k)
    return 1 - len(failures), failures, {**spent, "http_429": refused_429}


async def scenario_progress(args: argparse.Namespace, wire: Wire) -> tuple[int, list[str], dict[str, Any]]:
    steps = 4
    client, http = connect(args, wire, "legacy" if args.legacy else MODERN)

    async def one(i: int) -> str:
        seen: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        text = text_of(await client.call_tool("progress_steps", {"steps": steps, "delay": 0.2},
                                              progress_callback=on_progress))
        if seen != [float(k) for k in range(1, steps + 1)]:  # all of them, in order, before the result
            raise RuntimeError(f"progress before result was {seen}, result {text!r}")
        return text.partition(":")[0]

    async with http, client:
        insts, failures = await run_calls(args.calls, one)
    return len(insts), failures, {"instances": dict(Counter(insts)), "protocol": "legacy" if args.legacy else MODERN}


# ---- io.modelcontextprotocol/tasks client side (SEP-2663), minimal ---------------------------

TASKS_EXT = "io.modelcontextprotocol/tasks"


class CreateTaskResult(types.Result):
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    poll_interval_ms: int | None = None


class TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param: ClassVar[str | None] = "taskId"  # the SDK mirrors params.taskId into Mcp-Name


class CancelTask(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param: ClassVar[str | None] = "taskId"


ANY = TypeAdapter(dict[str, Any])


class TasksClient(ClientExtension):
    """Claims resultType "task" on tools/call; resolves it by polling tasks/get until terminal."""

    identifier = TASKS_EXT

    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self.cancel_after_create = False

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self.resolve)]

    async def resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
        params = TaskIdParams(taskId=created.task_id)
        if self.cancel_after_create:
            await ctx.session.send_request(CancelTask(params=params), ANY)
        while True:
            task = await ctx.session.send_request(GetTask(params=params), ANY)
            self.statuses[task["status"]] += 1
            if task["status"] == "completed":
                return types.CallToolResult.model_validate(task["result"])
            if task["status"] in ("failed", "cancelled"):  # isError: skips output-schema validation
                return types.CallToolResult(content=[types.TextContent(type="text", text=task["status"])],
                                            is_error=True)
            await anyio.sleep((task.get("pollIntervalMs") or 100) / 1000)


async def scenario_task(args: argparse.Namespace, wire: Wire) -> tuple[int, list[str], dict[str, Any]]:
    tasks = TasksClient()
    client, http = connect(args, wire, MODERN, extensions=[tasks])

    async def one(i: int) -> str:
        text = text_of(await client.call_tool("slow_task", {"seconds": 0.5}))
        if not text.endswith(":slept 0.5"):
            raise RuntimeError(f"unexpected {text!r}")
        return text.partition(":")[0]

    async with http, client:
        insts, failures = await run_calls(args.calls, one)
        # One more, cancelled right after creation: must end "cancelled".
        tasks.cancel_after_create = True
        try:
            ended = await client.call_tool("slow_task", {"seconds": 30})
            if not ended.is_error or ended.content[0].text != "cancelled":
                failures.append(f"cancelled task ended {ended.content}")
        except Exception as exc:
            failures.append(f"cancelled task: {describe(exc)}")
    return len(insts), failures, {"instances": dict(Counter(insts)), "task_statuses": dict(tasks.statuses)}


SCENARIOS = {
    "whoami": scenario_whoami,
    "multiround": scenario_multiround,
    "sessions": scenario_sessions,
    "elicitation": scenario_elicitation,
    "session_quota": scenario_session_quota,
    "progress": scenario_progress,
    "task": scenario_task,
}


async def main_async(args: argparse.Namespace) -> int:
    wire = Wire()
    started = time.monotonic()
    try:
        with anyio.fail_after(args.timeout):
            ok, failures, extra = await SCENARIOS[args.scenario](args, wire)
    except TimeoutError:
        ok, failures, extra = 0, [f"scenario timed out after {args.timeout}s"], {}
    except Exception as exc:  # a failure outside the per-call guards (connect, handshake, ...)
        ok, failures, extra = 0, [describe(exc)], {}
    for f in failures[:20]:
        print(f"FAIL {f}", file=sys.stderr)
    summary = {"scenario": args.scenario, "ok": ok, "failed": len(failures), **extra,
               "seconds": round(time.monotonic() - started, 2), "http": dict(sorted(wire.seen.items()))}
    if failures:
        summary["first_failure"] = failures[0][:300]
    print(json.dumps(summary), flush=True)
    return 1 if failures else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", help="MCP endpoint, e.g. http://127.0.0.1:8080/mcp")
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--calls", type=int, default=None, help="calls (default: whoami/multiround 30, sessions 10 per session, others 5)")
    ap.add_argument("--sessions", type=int, default=20, help="sessions scenario: concurrent legacy sessions")
    ap.add_argument("--legacy", action="store_true", help="progress scenario: use a legacy session")
    ap.add_argument("--header", action="append", default=[], metavar="NAME:VALUE",
                    help="extra HTTP header on every request (repeatable), e.g. Mcp-Routing-Id:r-1")
    ap.add_argument("--timeout", type=float, default=120.0, help="whole-scenario deadline in seconds")
    ap.add_argument("--no-keepalive", action="store_true", help="open a new connection for every request")
    args = ap.parse_args()
    if args.calls is None:
        args.calls = {"sessions": 10, "elicitation": 5, "progress": 5, "task": 5}.get(args.scenario, 30)
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
