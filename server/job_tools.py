"""The job tools (`start_job`, `job_status`, `cancel_job`) as ToolSpecs over one JobManager.

They go through the same registration path as the five product tools, so their schemas also
come from the pydantic models below and their errors read the same way. `server_specs` assembles
every tool a server serves (the product tools, then these) without the MCP SDK, so `kb-mcp call
--list` can list them without building a server.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.kb.errors import ErrorInfo
from kb_mcp.kb.models import utcnow
from kb_mcp.server.execution import ToolRunner
from kb_mcp.server.job_store import JobProgress, JobRecord, JobStatus, JobStore
from kb_mcp.server.jobs import JobManager, registered_job_kinds
from kb_mcp.server.registry import JOB_ONLY_MODULES, ToolSpec, load_tools
from kb_mcp.tools.base import Progress, ToolMeta
from kb_mcp.tools.context import ToolContext

MAX_WAIT_S = 120.0


class StartJobRequest(BaseModel):
    """Arguments of start_job."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="What to run: the name of a tool (e.g. profile_kernel) or a job-only kind.")
    arguments: dict[str, Any] = Field(
        default_factory=dict,
        description="The arguments of that tool, exactly as you would pass them to the tool itself.",
    )


class JobStatusRequest(BaseModel):
    """Arguments of job_status."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(description="The id start_job returned.")
    job_key: str | None = Field(
        None,
        description="The job_key start_job returned: without it the job's result comes without the "
        "candidate's output, summary and messages, and a failed job without its error text.",
    )
    wait_s: float = Field(
        0.0,
        ge=0.0,
        le=MAX_WAIT_S,
        description="Wait up to this many seconds for the job to finish before answering (progress is "
        "reported meanwhile). Keep it below your client's tool timeout; 0 answers at once.",
    )


class CancelJobRequest(BaseModel):
    """Arguments of cancel_job."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(description="The id start_job returned.")
    job_key: str = Field(description="The job_key start_job returned: only whoever started a job can cancel it.")


class JobView(BaseModel):
    """What an agent sees of a job: where it stands and, once done, its result or error."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    kind: str
    status: JobStatus
    progress: JobProgress | None = None
    elapsed_s: float | None = None
    result: dict[str, Any] | None = Field(
        None, description="The tool's own result (same fields as calling the tool directly), once succeeded."
    )
    error: str | None = None
    error_info: ErrorInfo | None = Field(None, description="The failure, structured: whose it is (caller, "
                                         "environment or kb-mcp), where, and what to do.")
    job_key: str | None = Field(
        None,
        description="Only in start_job's answer: pass it to job_status to see this job's private text "
        "(candidate output, exception text, errors). Keep it to yourself.",
    )
    next: str = Field(description="What to do next.")

    @classmethod
    def of(cls, record: JobRecord, job_key: str | None = None) -> JobView:
        """The view of a stored record, with a next-step hint."""
        started = record.started_at or record.created_at
        end: datetime = record.finished_at or utcnow()
        hints = {
            "queued": f"waiting for a free job slot; call job_status(job_id={record.job_id!r}, job_key, wait_s=30) "
                      "later",
            "running": f"call job_status(job_id={record.job_id!r}, job_key, wait_s=30) to wait for it",
            "succeeded": f"the result holds {record.kind}'s output; continue as after a direct {record.kind} call",
            "failed": "read the error, fix the cause and start a new job",
            "cancelled": "cancelled; start a new job if you still need it",
            "interrupted": "the server running it stopped; start the job again",
        }
        return cls(
            job_id=record.job_id,
            kind=record.kind,
            status=record.status,
            progress=None if record.finished else record.progress,
            elapsed_s=round((end - started).total_seconds(), 1),
            result=record.result,
            error=record.error,
            error_info=record.error_info,
            job_key=job_key,
            next=hints[record.status],
        )


def job_tool_specs(manager: JobManager) -> list[ToolSpec]:
    """The three job tools, bound to `manager`; descriptions list the kinds it can run."""
    kinds = ", ".join(manager.kind_names)

    def shown(record: JobRecord, key: str | None = None) -> JobView:
        return JobView.of(record if manager.is_submitter(record, key) else manager.public(record))

    def start(ctx: ToolContext, req: StartJobRequest, progress: Progress) -> JobView:
        key = secrets.token_hex(16)
        return JobView.of(manager.start(req.kind, req.arguments, key), job_key=key)

    def status(ctx: ToolContext, req: JobStatusRequest, progress: Progress) -> JobView:
        return shown(manager.wait(req.job_id, req.wait_s, progress), req.job_key)

    def cancel(ctx: ToolContext, req: CancelJobRequest, progress: Progress) -> JobView:
        return shown(manager.cancel(req.job_id, req.job_key), req.job_key)

    return [
        ToolSpec(
            name="start_job",
            description=(
                "Start long work in the background and get a job_id at once, instead of waiting on a tool "
                "call that may outlast your client's timeout. Use it for full profiles (profile_kernel), "
                "slow builds/verifications (compile_and_verify) and campaigns. `kind` is the tool to run, "
                "`arguments` its usual arguments (checked now: bad ones fail this call). "
                f"Kinds: {kinds}. Next: job_status(job_id, job_key, wait_s=30) until status is succeeded/failed "
                "(the job_key shows the job's output and error text: only its holder sees them); "
                "the finished job's `result` is what the tool itself would have returned. Jobs are stored "
                "beside the KB, so every server on the same KB can report them."
            ),
            request=StartJobRequest,
            result=JobView,
            run=start,
            meta=ToolMeta(title="Start a background job"),
        ),
        ToolSpec(
            name="job_status",
            description=(
                "Where a job started with start_job stands: status (queued, running, succeeded, failed, "
                "cancelled, interrupted), last progress, and once finished its `result` (the tool's output) "
                "or `error`. Pass wait_s to wait for completion with progress updates."
            ),
            request=JobStatusRequest,
            result=JobView,
            run=status,
            # it may mark a job whose server died `interrupted`: that records what already happened
            meta=ToolMeta(title="Job status", read_only=True, idempotent=True),
        ),
        ToolSpec(
            name="cancel_job",
            description=(
                "Ask a running or queued job you started to stop (pass its job_key). It stops at its next "
                "progress report (a queued job never starts); job_status then says cancelled."
            ),
            request=CancelJobRequest,
            result=JobView,
            run=cancel,
            # stops work another agent may be waiting on (a campaign resumes, other jobs do not)
            meta=ToolMeta(title="Cancel a job", destructive=True, idempotent=True),
        ),
    ]


def server_specs(
    ctx: ToolContext, tools: Sequence[ToolSpec] | None = None, job_kinds: Sequence[ToolSpec] | None = None
) -> tuple[JobManager, list[ToolSpec]]:
    """The job manager and every tool spec of a server over `ctx`, in the order it lists them.

    `tools` defaults to the product tools whose modules import; `job_kinds` (extra, job-only kinds)
    to those registered with `kb_mcp.server.jobs.register_job_kind` plus the lazily imported
    `registry.JOB_ONLY_MODULES`. Nothing is opened or started here (the KB opens on first use).
    """
    tool_specs = list(tools) if tools is not None else load_tools()
    extra_kinds = list(job_kinds) if job_kinds is not None else registered_job_kinds()
    jobs = JobManager(
        ToolRunner(ctx),
        [*tool_specs, *extra_kinds],
        JobStore(ctx.artifacts_dir / "jobs"),
        lazy_kinds=JOB_ONLY_MODULES if job_kinds is None else None,
    )
    return jobs, [*tool_specs, *job_tool_specs(jobs)]

