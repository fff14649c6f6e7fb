"""Turning a ToolSpec into an MCP tool of the SDK's MCPServer.

The input schema is the tool's Request model (its fields are the tool's top-level arguments),
the output schema its Result model. The tool function runs in a worker thread; its progress
reports become MCP progress notifications, and its failures become `isError` results whose text
says whose the failure is and what to do, with the same as structured content (`error_result`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel

from kb_mcp.harness.sandbox.attempts import on_behalf_of
from kb_mcp.server.agents import AGENT_PREFIX, CLIENT_SCOPE_KEY
from kb_mcp.server.execution import ToolFailure, ToolRunner, parse_request
from kb_mcp.server.job_slots import SESSIONLESS, submitted_by
from kb_mcp.server.registry import ToolSpec
from kb_mcp.tools.context import acting_for
from kb_mcp.tools.disclosure import redact, redact_data

log = logging.getLogger(__name__)

_PROGRESS_MIN_INTERVAL_S = 0.1  # tools may report in tight loops; clients need a few updates a second


class _RawArguments(FuncMetadata):
    """Hands the tool function the client's arguments unvalidated (after the SDK's JSON pre-parse).

    The function validates them against the tool's Request model itself, so that a bad argument
    is answered with a short message per field (not pydantic's full dump, which echoes whole
    kernel sources back into the agent's context).
    """

    def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
        return {"arguments": self.pre_parse_json(arguments_to_validate)}


class ProgressRelay:
    """A tool's `progress` callback that forwards to the MCP client from the worker thread.

    Reports are throttled, kept non-decreasing (MCP requires progress to increase), and double
    as cancellation points: when the client cancels the call, the next report raises in the
    tool's thread and the tool stops. A tool may also report from threads of its own: the relay
    holds the event loop's token, so any thread can send.
    """

    def __init__(self, mcp_ctx: Context[Any, Any]) -> None:
        self._ctx = mcp_ctx
        self._token = anyio.lowlevel.current_token()  # built in the request's task, on its loop
        self._lock = threading.Lock()
        self._last_value = -math.inf
        self._last_time = 0.0

    def __call__(self, done: float, total: float | None = None, message: str | None = None) -> None:
        try:
            anyio.from_thread.check_cancelled()
        except anyio.NoEventLoopError:
            pass  # a thread the tool started itself: no cancel scope to check from here
        now = time.monotonic()
        final = total is not None and done >= total
        with self._lock:
            if now - self._last_time < _PROGRESS_MIN_INTERVAL_S and not final:
                return
            value = max(float(done), self._last_value)
            self._last_value, self._last_time = value, now
        try:
            anyio.from_thread.run(self._ctx.report_progress, value, total, message, token=self._token)
        except Exception as exc:  # noqa: BLE001 - a client that went away must not fail the tool (cancellation is a
            # BaseException: it still stops the tool)
            log.debug("progress notification not delivered: %s", exc)


def compact_text(result: BaseModel) -> str:
    """The result as one line of JSON without null fields: what an agent's context pays for."""
    return result.model_dump_json(exclude_none=True)


def tool_result(result: BaseModel) -> CallToolResult:
    """Structured content (the full Result, matching the output schema) plus its compact text, with
    secret values redacted (`tools.disclosure`): nothing leaves the server unredacted."""
    return CallToolResult(
        content=[TextContent(type="text", text=redact(compact_text(result)))],
        structured_content=redact_data(result.model_dump(mode="json")),
    )


def error_result(failure: ToolFailure) -> CallToolResult:
    """An `isError` result: the message as text, and as structured content `{"error": ErrorInfo}`,
    so a client can tell the caller's mistakes, the environment's faults and kb-mcp's bugs apart
    (clients do not check error results against the output schema)."""
    return CallToolResult(
        content=[TextContent(type="text", text=redact(failure.message))],
        structured_content={"error": redact_data(failure.info.model_dump(mode="json", exclude_none=True))},
        is_error=True,
    )


def tool_annotations(spec: ToolSpec) -> ToolAnnotations:
    """The MCP tool annotations of what the tool module declares (`ToolMeta`)."""
    meta = spec.meta
    return ToolAnnotations(
        title=meta.title,
        read_only_hint=meta.read_only,
        destructive_hint=meta.destructive,
        idempotent_hint=meta.idempotent,
        open_world_hint=meta.open_world,
    )


MCP_SESSION_ID = "mcp-session-id"


def agent_of(request: Any) -> str | None:
    """The agent of the agents file the HTTP gate found sent `request` (`transport.BearerGate`: its
    token proves it), else None: the shared token's client is everyone who holds it, and nobody is
    named over stdio, in-process or on a loopback server started without a token."""
    scope = getattr(request, "scope", None)
    client = scope.get(CLIENT_SCOPE_KEY) if isinstance(scope, Mapping) else None
    return client if isinstance(client, str) and client.startswith(AGENT_PREFIX) else None


def submitter_of(request: Any) -> str | None:
    """Whose share of the job slots a request's jobs count towards: a named agent's, whatever session
    or protocol it uses; else its HTTP session's; else, for an HTTP request with neither, the one share
    of all such clients (`job_slots.SESSIONLESS`). None (not capped): no HTTP request at all, the one
    client of a stdio or in-process server."""
    if request is None:
        return None
    return agent_of(request) or http_session(request) or SESSIONLESS


@contextlib.contextmanager
def made_by(request: Any, given: str, own: str) -> Iterator[None]:
    """The work of `request` (tool calls, and the jobs and tasks they start) is done for whoever the
    HTTP gate found sent it, counts towards their share of the job slots, and what its sandboxed
    processes try is logged with their name (`named_for_attempts`; `given`: the name the client gave
    itself, `own`: the server's own name for its clients)."""
    with acting_for(agent_of(request)), submitted_by(submitter_of(request)), \
            on_behalf_of(named_for_attempts(request, given, own)):
        yield


def http_session(request: Any) -> str | None:
    """The streamable-HTTP session a request belongs to (`http:<Mcp-Session-Id>`: the server made the
    id, only its client holds it); None for a request without one (stdio, in-process, stateless)."""
    headers = getattr(request, "headers", None)
    session_id = headers.get(MCP_SESSION_ID) if headers is not None else None
    return f"http:{session_id}" if session_id else None


def named_for_attempts(request: Any, given: str, own: str) -> str:
    """Whom the server's log names for what a call's sandboxed processes try (`sandbox attempt by NAME`).

    Over HTTP, who the gate found sent the request (`agent_of`, else the server's own name for its
    clients, `own`), never a name the client gave itself: any client may call itself `agent:alice`,
    and the operator would then revoke the wrong token. Its own name follows, quoted, as a hint of
    which client it was (quoting keeps a line break in it from starting a log line of its own). A
    stdio or in-process server's one client is its machine's user: its own name is its name.
    """
    if request is None:
        return given or own
    sender = agent_of(request) or own
    return f"{sender} (calls itself {given!r})" if given and given != sender else sender


def client_name_of(mcp_ctx: Context[Any, Any]) -> str:
    """The calling client's name from its initialize handshake ('' when it gave none)."""
    try:
        params = mcp_ctx.session.client_params
    except Exception:  # noqa: BLE001 - no session (e.g. called outside a request)
        return ""
    info = params.client_info if params is not None else None
    return info.name if info is not None and info.name else ""


def as_mcp_tool(spec: ToolSpec, runner: ToolRunner, *, adopt_client_name: bool = False) -> Tool:
    """The SDK Tool for `spec`, running through `runner`.

    With `adopt_client_name` (a stdio server: one client per process), the first caller's
    name becomes the provenance of what this server records in the KB.
    """
    # Registered as an SDK `Tool` passed to MCPServer(tools=...), with the public `title` and
    # `annotations`. Not through `MCPServer.add_tool(fn)`: that derives the arguments from a function
    # signature, which would drop the Request model's own config (unknown arguments refused) and
    # answer a bad argument with pydantic's full dump instead of one line per field.
    # The SDK wants an ArgModelBase subclass; deriving it from the Request keeps every field,
    # validator and config of the tool's own model (used here for the JSON pre-parse).
    arg_model = type(f"{spec.name}_arguments", (spec.request, ArgModelBase), {"__module__": __name__})

    async def call(arguments: dict[str, Any], mcp_ctx: Context[Any, Any]) -> CallToolResult:
        if adopt_client_name and runner.ctx.client_name in ("", "mcp"):
            runner.ctx.client_name = client_name_of(mcp_ctx) or runner.ctx.client_name
        try:
            request = parse_request(spec, arguments)
            # The thread runs in a copy of this context, and so do the jobs it starts
            with made_by(mcp_ctx.request_context.request, client_name_of(mcp_ctx), runner.ctx.client_name):
                result = await anyio.to_thread.run_sync(runner.run, spec, request, ProgressRelay(mcp_ctx))
        except ToolFailure as failure:
            return error_result(failure)
        return tool_result(result)

    return Tool(
        fn=call,
        name=spec.name,
        title=spec.meta.title,
        annotations=tool_annotations(spec),
        description=spec.description,
        parameters=spec.input_schema(),
        fn_metadata=_RawArguments(arg_model=arg_model, output_model=spec.result),
        is_async=True,
        context_kwarg="mcp_ctx",
    )
