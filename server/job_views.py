"""kb://jobs: the recent jobs of every server on this KB, as the MCP resource shows them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from kb_mcp.server.job_store import JobProgress, JobStatus
from kb_mcp.server.jobs import JobManager


class JobSummary(BaseModel):
    """One line of kb://jobs."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    kind: str
    status: JobStatus
    progress: JobProgress | None = None
    created_at: datetime
    error: str | None = None


class JobsOverview(BaseModel):
    """kb://jobs."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[JobSummary]


def jobs_overview(jobs: JobManager, limit: int = 50) -> JobsOverview:
    """The most recent jobs of every server on this KB."""
    return JobsOverview(
        jobs=[
            JobSummary(
                job_id=r.job_id,
                kind=r.kind,
                status=r.status,
                progress=None if r.finished else r.progress,
                created_at=r.created_at,
                error=jobs.public(r).error,
            )
            for r in jobs.store.list(limit)
        ]
    )
