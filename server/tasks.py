"""MCP Tasks (protocol 2025-11-25): a task-augmented `tools/call` runs as a kb-mcp job.

A client that sees `capabilities.tasks` and a tool whose `execution.taskSupport` is `optional` may
send `tools/call` with a `task` field; the call then returns a task at once, and `tasks/get`,
`tasks/result` (waits for the end), `tasks/list` and `tasks/cancel` follow it. Tasks were added in
2025-11-25 and left the core protocol in 2026-07-28; mcp 2.3 defines their types but does not serve
them, so this module serves the four methods, on handshake-era sessions only. A task is a job
(`server/jobs.py`): the task id is the job id, every server on the KB can answer for it, and
`start_job` / `job_status` (the way for clients without Tasks) see the same work.

A task belongs to the MCP session that created it, as a job belongs to the holder of its job_key
(the task's job gets a key this server keeps for that session): only that session sees the task's
private text (the tool's output and error text) and may cancel it. Any other session, or this one
after the server restarted, sees what `job_status` shows without the key.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    CancelTaskRequestParams,
    CancelTaskResult,
    CreateTaskResult,
    GetTaskPayloadRequestParams,
    GetTaskRequestParams,
    GetTaskResult,
    ListTasksResult,
    PaginatedRequestParams,
    ServerTasksCapability,
    ServerTasksRequestsCapability,
    Task,
    TasksCallCapability,
    TasksCancelCapability,
    TasksListCapability,
    TasksToolsCapability,
    TextContent,
    ToolExecution,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from kb_mcp.server.execution import ToolFailure
from kb_mcp.server.job_store import JobRecord
from kb_mcp.server.jobs import JobManager
from kb_mcp.server.mcp_tools import client_name_of, http_session, made_by

log = logging.getLogger(__name__)

# job status -> task status (an interrupted job's server died: for the client, the task failed)
TASK_STATUS = {"queued": "working", "running": "working", "succeeded": "completed", "failed": "failed",
               "cancelled": "cancelled", "interrupted": "failed"}
DEFAULT_TTL_MS = 24 * 3600 * 1000  # job records are kept at least this long (they are never pruned today)
POLL_INTERVAL_MS = 2000
RESULT_POLL_S = 0.5
LIST_LIMIT = 100
RELATED_TASK = "io.modelcontextprotocol/related-task"


def _iso(moment: datetime | None) -> str:
    return (moment or datetime.now()).isoformat()


def task_of(record: JobRecord, ttl_ms: int | None = None) -> dict[str, Any]:
    """The Task fields of a job."""
    progress = record.progress
    message = record.error.splitlines()[0] if record.error else progress.message
    return {
        "task_id": record.job_id,
        "status": TASK_STATUS[record.status],
        "status_message": message,
        "created_at": _iso(record.created_at),
        "last_updated_at": _iso(record.finished_at or progress.updated_at or record.created_at),
        "ttl": ttl_ms if ttl_ms is not None else DEFAULT_TTL_MS,
        "poll_interval": POLL_INTERVAL_MS,
    }


class TaskService:
    """The task methods of one server, backed by its job manager."""

    def __init__(self, jobs: JobManager, tool_names: Iterable[str]) -> None:
        self.jobs = jobs
        # every product tool can run as a job; the job tools themselves cannot
        self.tools = frozenset(name for name in tool_names if name in jobs.kind_names)
        self._owners: dict[str, tuple[str, str]] = {}  # task id -> (the session that created it, its job's key)

    @staticmethod
    def _session(ctx: Any) -> str | None:
        """Who is asking: the streamable-HTTP session (its Mcp-Session-Id, which the server made and
        only that client holds), or the one client of a stdio or in-process server. None for a
        stateless HTTP request: it can own no task."""
        request = getattr(ctx, "request", None)
        return "local" if request is None else http_session(request)

    def _key(self, ctx: Any, task_id: str) -> str | None:
        """The job key of `task_id` if the session asking created it, else None."""
        owner = self._owners.get(task_id)
        session = self._session(ctx)
        return owner[1] if owner is not None and session is not None and owner[0] == session else None

    def _shown(self, ctx: Any, record: JobRecord) -> JobRecord:
        """The record as the asking session may see it (the private text only for its creator)."""
        return record if self.jobs.is_submitter(record, self._key(ctx, record.job_id)) else self.jobs.public(record)

    def supports(self, protocol_version: str | None) -> bool:
        """Tasks exist on the handshake-era protocol versions only."""
        return protocol_version is None or protocol_version in HANDSHAKE_PROTOCOL_VERSIONS

    async def middleware(self, ctx: Any, call_next: Any) -> Any:
        """Server middleware: a `tools/call` with a `task` field (on a protocol with Tasks) starts a
        job and answers with its task; everything else goes on unchanged.

        It answers before the SDK's `tools/call` handler because the SDK's per-version result check
        knows only CallToolResult for `tools/call`, not the CreateTaskResult a task-augmented call returns.
        """
        raw = ctx.params if isinstance(ctx.params, dict) else None
        if ctx.method != "tools/call" or not raw or raw.get("task") is None or not self.supports(ctx.protocol_version):
            return await call_next(ctx)
        try:
            params = CallToolRequestParams.model_validate(raw, by_name=False)
        except ValueError as exc:
            raise MCPError(code=INVALID_PARAMS, message=f"invalid tools/call parameters: {exc}") from exc
        result = await self.call_tool(ctx, params)
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)

    async def call_tool(self, ctx: Any, params: CallToolRequestParams) -> CreateTaskResult | CallToolResult:
        """Starts the tool as a job owned by the asking session and returns its task (or the argument
        error, as without a task)."""
        assert params.task is not None
        if params.name not in self.tools:
            raise MCPError(code=INVALID_PARAMS, message=f"{params.name} does not run as a task; call it without `task`")
        key = secrets.token_hex(16)
        try:
            # a task counts towards its HTTP session's (or agent's) share of the job slots, as a start_job
            # call does, its job is that agent's, and what it tries in the sandbox is logged with its name
            with made_by(getattr(ctx, "request", None), client_name_of(ctx), self.jobs.runner.ctx.client_name):
                record = await anyio.to_thread.run_sync(self.jobs.start, params.name, dict(params.arguments or {}),
                                                        key)
        except ToolFailure as failure:  # arguments that fail validation fail the call, as without a task
            return CallToolResult(content=[TextContent(type="text", text=failure.message)], is_error=True)
        session = self._session(ctx)
        if session is not None:
            self._owners[record.job_id] = (session, key)
        log.info("task %s: %s runs as a job", record.job_id, params.name)
        return CreateTaskResult(task=Task(**task_of(record, params.task.ttl)))

    async def _record(self, task_id: str) -> JobRecord:
        try:
            return await anyio.to_thread.run_sync(self.jobs.status, task_id)
        except ToolFailure as failure:
            raise MCPError(code=INVALID_PARAMS, message=f"no task {task_id!r}: {failure.message}") from failure

    async def get(self, ctx: Any, params: GetTaskRequestParams) -> GetTaskResult:
        """`tasks/get`: where the task stands."""
        return GetTaskResult(**task_of(self._shown(ctx, await self._record(params.task_id))))

    async def result(self, ctx: Any, params: GetTaskPayloadRequestParams) -> CallToolResult:
        """`tasks/result`: waits for the task to end, then returns the tool's result (or its error)."""
        record = await self._record(params.task_id)
        while not record.finished:
            await anyio.sleep(RESULT_POLL_S)
            record = await self._record(params.task_id)
        record = self._shown(ctx, record)
        meta = {RELATED_TASK: {"taskId": record.job_id}}
        if record.status == "succeeded" and record.result is not None:
            text = json.dumps({k: v for k, v in record.result.items() if v is not None}, separators=(",", ":"))
            return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=record.result,
                                  meta=meta)
        reason = record.error or f"the task ended {record.status}"
        return CallToolResult(content=[TextContent(type="text", text=reason)], is_error=True, meta=meta)

    async def list(self, ctx: Any, params: PaginatedRequestParams) -> ListTasksResult:
        """`tasks/list`: the most recent jobs, newest first (one page)."""
        records = await anyio.to_thread.run_sync(self.jobs.store.list, LIST_LIMIT)
        return ListTasksResult(tasks=[Task(**task_of(self._shown(ctx, r))) for r in records])

    async def cancel(self, ctx: Any, params: CancelTaskRequestParams) -> CancelTaskResult:
        """`tasks/cancel`: asks the job to stop (at its next progress report); a finished task, or one
        another session created, is an error."""
        before, key = await self._record(params.task_id), self._key(ctx, params.task_id)
        if not self.jobs.is_submitter(before, key):
            raise MCPError(code=INVALID_PARAMS, message=f"task {params.task_id} was not created by this session: "
                           "only the session that created a task can cancel it")
        if before.finished:
            raise MCPError(code=INVALID_PARAMS,
                           message=f"task {params.task_id} already ended ({TASK_STATUS[before.status]})")
        try:
            record = await anyio.to_thread.run_sync(self.jobs.cancel, params.task_id, key)
        except ToolFailure as failure:
            raise MCPError(code=INVALID_PARAMS, message=failure.message) from failure
        fields = task_of(record)
        if not record.finished:  # stops at its next progress report: report it as on its way out
            fields["status"], fields["status_message"] = "cancelled", "cancel requested"
        return CancelTaskResult(**fields)


def install(server: MCPServer[Any], jobs: JobManager, tool_names: Iterable[str]) -> TaskService:
    """Serves Tasks on `server` with `jobs`: the four methods, task-aware `tools/call` and the
    capability; `mark_task_tools` sets `execution.taskSupport` on the tools that can run as tasks."""
    service = TaskService(jobs, tool_names)
    low = server._lowlevel_server
    low.middleware.append(service.middleware)
    low.add_request_handler("tasks/get", GetTaskRequestParams, service.get)
    low.add_request_handler("tasks/result", GetTaskPayloadRequestParams, service.result)
    low.add_request_handler("tasks/list", PaginatedRequestParams, service.list)
    low.add_request_handler("tasks/cancel", CancelTaskRequestParams, service.cancel)
    derive = low.get_capabilities

    def capabilities(*args: Any, protocol_version: str | None = None, **kwargs: Any) -> Any:
        caps = derive(*args, protocol_version=protocol_version, **kwargs)
        if service.supports(protocol_version):
            caps.tasks = ServerTasksCapability(
                list=TasksListCapability(), cancel=TasksCancelCapability(),
                requests=ServerTasksRequestsCapability(tools=TasksToolsCapability(call=TasksCallCapability())),
            )
        return caps

    low.get_capabilities = capabilities  # type: ignore[method-assign]
    return service


def mark_task_tools(tools: list[Any], names: frozenset[str]) -> list[Any]:
    """Sets `execution.taskSupport = optional` on the listed tools that can run as tasks."""
    for tool in tools:
        if tool.name in names:
            tool.execution = ToolExecution(task_support="optional")
    return tools
