"""Read-only MCP resources: the KB's states, candidates, outcomes and statistics, campaigns and jobs.

Each read goes to the store, which re-reads the KB file when another process changed it, so a
resource always shows what every server sharing the KB has recorded. The documents are the ones
`kb-mcp kb states|candidates|candidate|outcomes|campaigns|stats --json` print (`server/kb_views.py`).

A templated resource whose id the KB does not hold raises `ResourceNotFoundError`; the server
answers it with the error code of the protocol version in use (`app.KbMcpServer.read_resource`).
Completions for the ids in `kb://state/{state_id}` and `kb://candidate/{candidate_id}` come from
`complete`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from mcp_types import Completion, CompletionArgument, CompletionContext, PromptReference, ResourceTemplateReference

from kb_mcp.kb.errors import KbMcpError
from kb_mcp.server import job_views, kb_views
from kb_mcp.server.jobs import JobManager
from kb_mcp.tools.context import ToolContext

JSON = "application/json"
STATE_TEMPLATE = "kb://state/{state_id}"
CANDIDATE_TEMPLATE = "kb://candidate/{candidate_id}"
MAX_COMPLETIONS = 100  # the protocol's limit per completion response


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
    """Adds the kb:// resources and the completion handler to `server`."""
    _register_states(server, ctx)
    _register_records(server, ctx)
    _register_activity(server, ctx, jobs)

    @server.completion()
    async def complete(
        ref: PromptReference | ResourceTemplateReference, argument: CompletionArgument,
        context: CompletionContext | None
    ) -> Completion | None:
        return completions(ctx, ref, argument)


def _register_states(server: MCPServer[Any], ctx: ToolContext) -> None:
    """The KB's states, one state in full, and the KB's statistics."""

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
        STATE_TEMPLATE,
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
            raise ResourceNotFoundError(f"no state {state_id!r} in the KB; kb://states lists the ids")
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


def _register_records(server: MCPServer[Any], ctx: ToolContext) -> None:
    """Verified candidates and recorded outcomes, newest first, and one candidate in full."""

    @server.resource(
        "kb://candidates",
        name="candidates",
        title="Verified candidates",
        description="The 50 newest candidates compile_and_verify has judged (any agent on this KB): "
        "candidate_id, problem, verdict, speedup over the better baseline, device, outcomes recorded; flagged "
        "ones (held for review, never credited) with their finding codes, and `attempt`: what the candidate tried "
        "that the sandbox refuses (sandbox_attempt).",
        mime_type=JSON,
    )
    @_worded
    def candidates() -> str:
        return kb_views.candidates_overview(ctx.store).model_dump_json(exclude_none=True)

    @server.resource(
        CANDIDATE_TEMPLATE,
        name="candidate",
        title="One candidate",
        description="One candidate by candidate_id: the server's verdict and timings, its source as "
        "verified, its lineage (the candidates and optimizations that led to it, and those made from "
        "it) and the outcomes recorded with it.",
        mime_type=JSON,
    )
    @_worded
    def candidate(candidate_id: str) -> str:
        detail = kb_views.candidate_detail(ctx.store, ctx.candidates_dir, candidate_id)
        if detail is None:
            raise ResourceNotFoundError(f"no candidate {candidate_id!r} in the KB; kb://candidates lists the newest")
        return detail.model_dump_json(exclude_none=True)

    @server.resource(
        "kb://outcomes",
        name="outcomes",
        title="Recorded outcomes",
        description="The 50 newest outcomes (the KB's replay buffer): problem, state, optimization, "
        "verdict, speedup, candidate, agent, analysis.",
        mime_type=JSON,
    )
    @_worded
    def outcomes() -> str:
        return kb_views.outcomes_overview(ctx.store).model_dump_json(exclude_none=True)


def _register_activity(server: MCPServer[Any], ctx: ToolContext, jobs: JobManager) -> None:
    """What runs on this KB: campaigns and recent jobs."""

    @server.resource(
        "kb://campaigns",
        name="campaigns",
        title="Campaigns",
        description="Campaigns run on this KB (kb-mcp run-campaign): name, state, problems, runs, report file.",
        mime_type=JSON,
    )
    def campaigns() -> str:
        return kb_views.campaigns_overview(ctx.artifacts_dir).model_dump_json(exclude_none=True)

    @server.resource(
        "kb://jobs",
        name="jobs",
        title="Recent jobs",
        description="The 50 most recent jobs (any server on this KB): id, kind, status, progress.",
        mime_type=JSON,
    )
    def recent_jobs() -> str:
        return job_views.jobs_overview(jobs).model_dump_json(exclude_none=True)


def completions(ctx: ToolContext, ref: PromptReference | ResourceTemplateReference,
                argument: CompletionArgument) -> Completion | None:
    """Ids that start with what was typed, for the templates' id arguments (None: nothing to offer)."""
    if not isinstance(ref, ResourceTemplateReference):
        return None
    typed = argument.value or ""
    if ref.uri == STATE_TEMPLATE and argument.name == "state_id":
        with ctx.store.read() as view:
            ids = view.state_ids()
    elif ref.uri == CANDIDATE_TEMPLATE and argument.name == "candidate_id":
        ids = [c.candidate_id for c in kb_views.candidates_overview(ctx.store, limit=kb_views.MAX_ROWS).candidates]
    else:
        return None
    found = [i for i in ids if i.startswith(typed)]
    if ref.uri == STATE_TEMPLATE:
        found.sort()
    return Completion(values=found[:MAX_COMPLETIONS], total=len(found), has_more=len(found) > MAX_COMPLETIONS)
