"""The kb-mcp MCP server: tools, job tools, KB resources and the round prompt on one MCPServer.

`build_server` is the one place that assembles it; `kb-mcp serve`, `kb-mcp call` and the tests
all use it, so every way in sees the same tools, schemas and error messages.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, InputRequiredResult
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from kb_mcp.server import logs, prewarm, prompts, resources, tasks
from kb_mcp.server.about import package_version
from kb_mcp.server.execution import unknown_tool
from kb_mcp.server.gpu import gpu_summary
from kb_mcp.server.job_tools import server_specs
from kb_mcp.server.jobs import JobManager
from kb_mcp.server.mcp_tools import as_mcp_tool, error_result
from kb_mcp.server.registry import ToolSpec
from kb_mcp.tools.context import ToolContext

log = logging.getLogger(__name__)

SERVER_NAME = "kb-mcp"


def instructions(tool_names: Sequence[str], gpu_tools: Sequence[str]) -> str:
    """What the client shows its model about this server as a whole."""
    return (
        "kb-mcp: a lab bench and a shared memory for optimizing CUDA kernels (KernelBench problems). "
        "Loop: profile_kernel -> classify_state -> suggest_optimizations -> write a candidate -> "
        "compile_and_verify -> record_outcome; the prompt `optimization_round` explains each step. "
        "Work longer than your tool timeout goes through start_job / job_status (or, for clients with "
        "MCP Tasks, a task-augmented tools/call). "
        "Resources read the KB: kb://states, kb://state/{id}, kb://candidates, kb://candidate/{id} "
        "(verdict, source, lineage), kb://outcomes, kb://stats, kb://campaigns, kb://jobs. "
        f"Tools here: {', '.join(tool_names)}. {gpu_summary(gpu_tools)}"
    )


# "Resource not found" up to protocol 2025-11-25; 2026-07-28 retired the code for -32602 (SEP-2164),
# which the SDK sends for ResourceNotFoundError.
RESOURCE_NOT_FOUND = -32002


class KbMcpServer(MCPServer[Any]):
    """MCPServer plus what kb-mcp built it from (its ToolContext, tool specs and job manager)."""

    def __init__(self, ctx: ToolContext, specs: Sequence[ToolSpec], jobs: JobManager, **kwargs: Any) -> None:
        self.kb_ctx = ctx
        self.specs: dict[str, ToolSpec] = {spec.name: spec for spec in specs}
        self.jobs = jobs
        self.task_tools: frozenset[str] = frozenset()  # set by tasks.install
        self.profiler_warmup: threading.Thread | None = None  # set as it starts (server.prewarm)
        super().__init__(**kwargs)

    @property
    def gpu_tools(self) -> list[str]:
        """The tools that time or profile on the GPU (as their modules declare)."""
        return [name for name, spec in self.specs.items() if spec.uses_gpu]

    async def list_tools(self) -> list[Any]:
        """The tools, those that can run as MCP Tasks marked `execution.taskSupport = optional`."""
        return tasks.mark_task_tools(await super().list_tools(), self.task_tools)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        """Calls a tool; an unknown name is the caller's error like any other (structured, with the
        tools this server has), not the SDK's bare "Unknown tool" text."""
        names = [tool.name for tool in await super().list_tools()]
        if name not in names:
            return error_result(unknown_tool(name, names))
        return await super().call_tool(name, arguments, context)

    async def read_resource(self, uri: Any, context: Context | None = None) -> Any:
        """Reads a resource; a missing one gets the error code of the client's protocol version."""
        try:
            return await super().read_resource(uri, context)
        except ResourceNotFoundError as exc:
            version = (
                context.request_context.protocol_version if context is not None and context._request_context else None
            )
            if version in HANDSHAKE_PROTOCOL_VERSIONS:
                raise MCPError(code=RESOURCE_NOT_FOUND, message=str(exc), data={"uri": str(uri)}) from exc
            raise


def build_server(
    ctx: ToolContext | None = None,
    *,
    tools: Sequence[ToolSpec] | None = None,
    job_kinds: Sequence[ToolSpec] | None = None,
    adopt_client_name: bool = False,
) -> KbMcpServer:
    """Assembles the server over `ctx` (default: the KB from $KB_MCP_KB / ~/.kb-mcp).

    `tools` and `job_kinds` are as in `job_tools.server_specs`. An HTTP server's bearer token is checked in
    front of the app (`transport.BearerGate`).
    `adopt_client_name` (stdio: one client per process) records the client's name as provenance.
    """
    ctx = ctx or ToolContext()
    jobs, all_specs = server_specs(ctx, tools, job_kinds)
    runner = jobs.runner

    @asynccontextmanager
    async def lifespan(server: MCPServer[Any]) -> AsyncIterator[None]:
        interrupted = jobs.recover()
        if interrupted:
            log.info("marked %d job(s) of stopped servers interrupted: %s", len(interrupted), ", ".join(interrupted))
        # In the background: the client's handshake is answered while the driver starts (prewarm).
        if isinstance(server, KbMcpServer):
            server.profiler_warmup = prewarm.warm_profiler(ctx)
        try:
            yield None
        finally:  # here, not after the serve loop: uvicorn re-raises a SIGTERM once the app has stopped
            logs.refusals.flush()  # the counts of the lines held back in windows still open

    server = KbMcpServer(
        ctx,
        all_specs,
        jobs,
        name=SERVER_NAME,
        title="kb-mcp: CUDA kernel optimization with a shared Knowledge Base",
        version=package_version(),
        instructions=instructions([spec.name for spec in all_specs], [s.name for s in all_specs if s.uses_gpu]),
        tools=[as_mcp_tool(spec, runner, adopt_client_name=adopt_client_name) for spec in all_specs],
        lifespan=lifespan,
        log_level="INFO",
    )
    resources.register(server, ctx, jobs)
    server.task_tools = tasks.install(server, jobs, server.specs).tools
    server.prompt(name=prompts.ROUND_PROMPT_NAME, description=prompts.ROUND_PROMPT_DESCRIPTION)(
        prompts.optimization_round
    )
    return server
