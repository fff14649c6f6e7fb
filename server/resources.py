"""Read-only MCP resources: the KB's states and statistics, and recent jobs.

Each read goes to the store, which re-reads the KB file when another process changed it, so a
resource always shows what every server sharing the KB has recorded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError

from kb_mcp.kb.errors import KbMcpError
from kb_mcp.server import kb_views
from kb_mcp.server.jobs import JobManager
from kb_mcp.tools.context import ToolContext

JSON = "application/json"


def _worded(fn: Callable[..., str]) -> Callable[..., str]:
    """KB errors (a damaged, missing or locked KB) reach the client in words, not as a crash."""

    @functools.wraps(fn)
    def read(*args: Any, **kwargs: Any) -> str:
        try:
            return fn(*args, **kwargs)
        except KbMcpError as exc:
            raise ResourceError(f"the KB cannot be read ({exc.whose}'s to fix): {exc}") from exc

    return read


def register(server: MCPServer[Any], ctx: ToolContext, jobs: JobManager) -> None:
    """Adds kb://states, kb://state/{state_id}, kb://stats and kb://jobs to `server`."""

    @server.resource(
        "kb://states",
        name="states",
        title="KB states",
        description="Every performance state in the KB: id, name, bottleneck pair, origin, how many "
        "optimizations have scores there and how many outcomes were recorded in it.",
        mime_type=JSON,
    )
    @_worded
    def states() -> str:
        return kb_views.states_overview(ctx.store).model_dump_json(exclude_none=True)

    @server.resource(
        "kb://state/{state_id}",
        name="state",
        title="One KB state",
        description="One state in full: description, signature (metric ranges), and its optimizations "
        "ranked by expected speedup with confidence, counts and lessons.",
        mime_type=JSON,
    )
    @_worded
    def state(state_id: str) -> str:
        view = kb_views.state_detail(ctx.store, state_id)
        if view is None:
            raise ResourceError(f"no state {state_id!r} in the KB; kb://states lists the ids")
        return view.model_dump_json(exclude_none=True)

    @server.resource(
        "kb://stats",
        name="stats",
        title="KB statistics",
        description="Size and activity of the KB: counts of states, optimizations, scores, outcomes, "
        "lessons and verified candidates, verdict tallies, and the KB file in use.",
        mime_type=JSON,
    )
    @_worded
    def stats() -> str:
        return kb_views.kb_stats(ctx.store, ctx.kb_path).model_dump_json(exclude_none=True)

    @server.resource(
        "kb://jobs",
        name="jobs",
        title="Recent jobs",
        description="The 50 most recent jobs (any server on this KB): id, kind, status, progress.",
        mime_type=JSON,
    )
    def recent_jobs() -> str:
        return kb_views.jobs_overview(jobs).model_dump_json(exclude_none=True)
