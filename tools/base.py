"""What tool modules share: the error an agent can act on, the progress callback, and the metadata
each tool module declares about itself.

A tool module exports NAME, DESCRIPTION, META (a `ToolMeta`), Request, Result and
`run(ctx, req, progress) -> Result` (docs/architecture.md, Tools).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.kb.progress import Progress, no_progress

if TYPE_CHECKING:
    from kb_mcp.tools.context import ToolContext

__all__ = ["GPU_LANE_ATTR", "Progress", "ToolError", "ToolMeta", "gpu_lane_inside", "no_progress", "on_gpu_lane"]

from kb_mcp.kb.errors import EnvironmentFault, ToolError

__all__ = ["Progress", "ToolError", "harness_unavailable", "no_progress"]


def harness_unavailable(exc: BaseException) -> EnvironmentFault:
    """No harness worker could start on this machine (its sandbox cannot be set up as the environment
    asks, a worker cannot start): the environment's to fix, not the caller's arguments."""
    return EnvironmentFault(f"the harness cannot run on this machine: {exc}",
                            action="fix what this names (`kb-mcp doctor` checks the sandbox and the harness and "
                            "says how), then call again")


class ToolMeta(BaseModel):
    """What a tool says about itself beyond its schemas; the server publishes the hints as MCP
    tool annotations (clients use them to decide, e.g., which calls to approve without asking)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str = Field(description="human-readable name shown by clients")
    uses_gpu: bool = Field(False, description="times or profiles on the GPU: `run` holds the GPU lane")
    read_only: bool = Field(False, description="changes nothing: no KB record, no stored artifact")
    destructive: bool = Field(False, description="may delete or overwrite what others stored")
    idempotent: bool = Field(False, description="calling again with the same arguments changes nothing more")
    open_world: bool = Field(False, description="reaches systems outside this server and its KB (e.g. an LLM)")
    long_running: bool = Field(False, description="runs for minutes to hours (a campaign): as a job it waits for "
                               "one of the few slots kept for long jobs, never taking every job slot")


GPU_LANE_ATTR = "holds_gpu_lane"
"""Set on a `run` wrapped by `on_gpu_lane` or marked `gpu_lane_inside`; the registry checks it against
`ToolMeta.uses_gpu`."""

RunT = TypeVar("RunT", bound=Callable[..., Any])


def on_gpu_lane(name: str) -> Callable[[RunT], RunT]:
    """Decorates a tool's `run` so that the whole call holds its context's GPU lane.

    Taking the lane inside `run` (not in one caller) means every way in, MCP call, job, campaign
    or a direct call, takes turns with every other.
    """

    def wrap(run: RunT) -> RunT:
        @functools.wraps(run)
        def on_lane(ctx: ToolContext, req: Any, progress: Progress = no_progress) -> Any:
            with ctx.gpu_lane.hold(name, progress):
                return run(ctx, req, progress)

        setattr(on_lane, GPU_LANE_ATTR, True)
        return on_lane  # type: ignore[return-value]

    return wrap


def gpu_lane_inside(run: RunT) -> RunT:
    """Marks a tool's `run` whose GPU work the harness itself does under the GPU lane, and only
    that: the tool's reading and checks, the candidate's build and the KB write run outside it, so
    other calls build and store while one times (`harness.pool.pool.WorkerPool.verify`).

    Every way in (MCP call, job, campaign, a direct call) still takes turns on the GPU, because the
    harness takes the lane around each GPU request whoever calls it."""
    setattr(run, GPU_LANE_ATTR, True)
    return run
