"""One MCP server instance (official Python SDK, mcp==2.3.0) for the mrtr-router interop tests.

    python server.py --port 9001 --name worker-1          # --port 0 picks a free port
    python server.py --port 0 --name w --tls-cert cert.pem --tls-key key.pem   # HTTPS
    -> prints "READY <port>" on stdout (flushed) once it accepts connections.

Streamable HTTP at http://127.0.0.1:<port>/mcp (https:// with --tls-cert/--tls-key). The SDK serves the 2025 session protocol
(initialize handshake, Mcp-Session-Id) and the 2026-07-28 per-request protocol on the same
endpoint, chosen per request by the MCP-Protocol-Version header. `requestState` is sealed with
the SDK's default per-process key, so a retry that reaches another instance gets HTTP 400
"Invalid or expired requestState" (pass --state-key to share a key between instances).

Tools:
  whoami            -> NAME
  balance           -> "NAME:balance 100" (a read the OAuth tests give a scope of its own)
  counter           -> "NAME:<n>", n counts calls per legacy session (per Mcp-Session-Id)
  confirm_transfer  -> two rounds of input (two elicitations): on 2026-07-28 as two
                       input_required results (requestState + inputRequests); on a legacy
                       session as two elicitation/create requests on the POST's SSE stream
  progress_steps    -> sends `steps` progress notifications (delay apart), then "NAME:done <steps>"
  slow_task         -> on 2026-07-28, for a client declaring io.modelcontextprotocol/tasks,
                       answers resultType "task" and runs in the background (tasks/get,
                       tasks/update, tasks/cancel; SEP-2663). The SDK ships no tasks runtime,
                       so the extension below is ours, built on the SDK's Extension API.
                       tasks/get answers name the instance in "servedBy".
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import uuid
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

import uvicorn
from mcp.server.context import CallNext, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    HEADER_MISMATCH,
    INVALID_PARAMS,
    CallToolRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    RequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field
from serving import serve_saying_ready  # tests/interop/serving.py, beside this file

TASKS_EXT = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")


class Approve(BaseModel):
    approved: bool


class Code(BaseModel):
    code: str


def elicit_request(message: str, schema: type[BaseModel]) -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema.model_json_schema()))


def build(name: str, state_key: str | None) -> MCPServer:
    security = RequestStateSecurity(keys=[state_key], audience="mrtr-interop") if state_key else None
    mcp = MCPServer("mrtr-interop", instructions=f"instance {name}", extensions=[Tasks(name)],
                    request_state_security=security)
    counters: dict[str, int] = defaultdict(int)

    @mcp.tool()
    def whoami() -> str:
        """Name of the instance that served this call."""
        return name

    @mcp.tool()
    def balance() -> str:
        """The account's balance, as read by this instance."""
        return f"{name}:balance 100"

    @mcp.tool()
    def counter(ctx: Context) -> str:
        """Per-session counter: NAME:<calls so far in this Mcp-Session-Id>."""
        sid = (ctx.headers or {}).get("mcp-session-id", "-")
        counters[sid] += 1
        return f"{name}:{counters[sid]}"

    @mcp.tool()
    async def confirm_transfer(amount: int, ctx: Context) -> str | InputRequiredResult:
        """Needs two rounds of user input: an approval, then a one-time code."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:  # legacy session: ask over SSE
            first = await ctx.elicit(f"Approve transfer of {amount}?", Approve)
            if first.action != "accept" or not first.data.approved:
                return f"{name}:declined"
            second = await ctx.elicit(f"Enter the one-time code for {amount}", Code)
            if second.action != "accept":
                return f"{name}:declined"
            return f"{name}:transferred {amount} code={second.data.code}"
        # 2026-07-28: each round answers input_required; requestState (plaintext here, sealed
        # on the wire by the SDK) remembers where we are.
        state, responses = ctx.request_state, ctx.input_responses or {}
        if state is None:
            return InputRequiredResult(
                input_requests={"approve": elicit_request(f"Approve transfer of {amount}?", Approve)},
                request_state="round-1",
            )
        if state == "round-1":
            answer = responses.get("approve")
            if answer is None or answer.action != "accept" or not (answer.content or {}).get("approved"):
                return f"{name}:declined"
            return InputRequiredResult(
                input_requests={"code": elicit_request(f"Enter the one-time code for {amount}", Code)},
                request_state="round-2",
            )
        answer = responses.get("code")
        if state != "round-2" or answer is None or answer.action != "accept":
            return f"{name}:declined"
        return f"{name}:transferred {amount} code={(answer.content or {}).get('code')}"

    @mcp.tool()
    async def progress_steps(ctx: Context, steps: int = 4, delay: float = 0.2) -> str:
        """Reports `steps` progress notifications, `delay` seconds apart, then answers."""
        for i in range(1, steps + 1):
            await asyncio.sleep(delay)
            await ctx.report_progress(i, steps, f"step {i}/{steps}")
        return f"{name}:done {steps}"

    @mcp.tool()
    async def slow_task(seconds: float = 1.0) -> str:
        """Sleeps `seconds`. Runs as a task (io.modelcontextprotocol/tasks) when the client allows."""
        await asyncio.sleep(seconds)
        return f"{name}:slept {seconds}"

    return mcp


# ---- io.modelcontextprotocol/tasks (SEP-2663), minimal, in memory ----------------------------


class TaskIdParams(RequestParams):
    task_id: str = Field(alias="taskId")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Tasks(Extension):
    identifier = TASKS_EXT
    task_tools = frozenset({"slow_task"})

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self.tasks: dict[str, dict[str, Any]] = {}
        self.runners: dict[str, asyncio.Task[None]] = {}

    def methods(self) -> list[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", TaskIdParams, self.get, modern),
            MethodBinding("tasks/update", TaskIdParams, self.update, modern),
            MethodBinding("tasks/cancel", TaskIdParams, self.cancel, modern),
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> Any:
        caps = (ctx.meta or {}).get(CLIENT_CAPABILITIES_META_KEY) or {}
        if params.name not in self.task_tools or TASKS_EXT not in (caps.get("extensions") or {}):
            return await call_next(ctx)
        task_id = f"{self.instance}-{uuid.uuid4().hex}"
        now = _now()
        task = {"taskId": task_id, "status": "working", "createdAt": now, "lastUpdatedAt": now,
                "ttlMs": 600_000, "pollIntervalMs": 100}
        self.tasks[task_id] = task
        self.runners[task_id] = asyncio.create_task(self._run(task, call_next, ctx))
        return {"resultType": "task", **task}

    async def _run(self, task: dict[str, Any], call_next: CallNext, ctx: ServerRequestContext[Any, Any]) -> None:
        try:
            result = await call_next(ctx)
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True) if isinstance(
                result, BaseModel) else result
            task.update(status="completed", result=dumped)
        except asyncio.CancelledError:
            task.update(status="cancelled")
        except MCPError as exc:
            task.update(status="failed", error={"code": exc.code, "message": str(exc)})
        task["lastUpdatedAt"] = _now()
        self.runners.pop(task["taskId"], None)

    def _find(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        headers = getattr(ctx.request, "headers", None) or {}
        if headers.get("mcp-name") != params.task_id:  # SEP-2663: Mcp-Name MUST equal params.taskId
            raise MCPError(code=HEADER_MISMATCH, message="Mcp-Name header does not match params.taskId")
        task = self.tasks.get(params.task_id)
        if task is None:
            raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found")
        return task

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        return {"resultType": "complete", **self._find(ctx, params), "servedBy": self.instance}

    async def update(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        self._find(ctx, params)  # slow_task never asks for input: nothing to apply
        return {"resultType": "complete"}

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        task = self._find(ctx, params)
        runner = self.runners.get(task["taskId"])
        if runner is not None:
            runner.cancel()
        return {"resultType": "complete"}


# ---- main ------------------------------------------------------------------------------------


async def serve(mcp: MCPServer, port: int, tls_cert: str | None = None, tls_key: str | None = None) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    app = mcp.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2,
                                           ssl_certfile=tls_cert, ssl_keyfile=tls_key))
    await serve_saying_ready(server, sock)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0 = pick a free one)")
    ap.add_argument("--name", required=True, help="instance name, returned by whoami/counter")
    ap.add_argument("--state-key", default=None,
                    help="share this requestState key (>= 32 bytes) between instances (default: SDK per-process key)")
    ap.add_argument("--tls-cert", default=None, help="serve HTTPS with this PEM certificate (with --tls-key)")
    ap.add_argument("--tls-key", default=None, help="the certificate's PEM private key")
    args = ap.parse_args()
    try:
        asyncio.run(serve(build(args.name, args.state_key), args.port, args.tls_cert, args.tls_key))
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
