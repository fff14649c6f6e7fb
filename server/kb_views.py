"""Compact read-only views of the KB and of jobs, for the MCP resources and the start-up banner.

Views are pydantic models built from the store's own records (kb/models.py); they only select and
rank, never restate a record's fields under other names.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.kb.models import ALL_ARCH, Optimization, Score, State
from kb_mcp.kb.view import KBStats
from kb_mcp.server.jobs import JobManager, JobProgress, JobStatus

if TYPE_CHECKING:
    from kb_mcp.kb.store import KBStore

MAX_LESSONS_SHOWN = 3


class StateSummary(BaseModel):
    """One line of kb://states."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    bottleneck: str  # signature key, e.g. memory/dram_bandwidth
    origin: str
    scored_optimizations: int
    outcomes: int


class StatesOverview(BaseModel):
    """kb://states."""

    model_config = ConfigDict(extra="forbid")

    count: int
    states: list[StateSummary]


class RankedOptimization(BaseModel):
    """An optimization as seen from one state: the record, its score there (pooled over GPU
    families) with the two numbers derived from it, and the newest lessons."""

    model_config = ConfigDict(extra="forbid")

    optimization: Optimization
    score: Score
    expected_speedup: float
    confidence: float
    lessons: list[str] = Field(default_factory=list)


class StateDetail(BaseModel):
    """kb://state/{id}."""

    model_config = ConfigDict(extra="forbid")

    state: State
    outcomes: int
    optimizations: list[RankedOptimization]


class KbStatsView(BaseModel):
    """kb://stats: the store's own statistics plus which file they describe."""

    model_config = ConfigDict(extra="forbid")

    kb_path: str
    stats: KBStats


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


def states_overview(store: KBStore) -> StatesOverview:
    """Every state with its bottleneck pair and how much the KB knows there."""
    with store.read() as view:
        outcomes = Counter(o.state_id for o in view.outcomes())
        states = [
            StateSummary(
                id=state.id,
                name=state.name,
                bottleneck=state.signature.key,
                origin=state.origin,
                scored_optimizations=len(view.scores(state.id, ALL_ARCH)),
                outcomes=outcomes[state.id],
            )
            for state in view.list_states()
        ]
    return StatesOverview(count=len(states), states=states)


def state_detail(store: KBStore, state_id: str) -> StateDetail | None:
    """One state with its applicable optimizations ranked by expected speedup (None if no such state)."""
    with store.read() as view:
        state = view.get_state(state_id)
        if state is None:
            return None
        ranked: list[RankedOptimization] = []
        for score in view.candidates(state_id, ALL_ARCH):
            opt = view.get_optimization(score.optimization_id)
            if opt is None:
                continue
            ranked.append(
                RankedOptimization(
                    optimization=opt,
                    score=score,
                    expected_speedup=round(score.expected_speedup, 4),
                    confidence=round(score.confidence, 4),
                    lessons=[x.text for x in view.lessons(state_id, opt.id, MAX_LESSONS_SHOWN)],
                )
            )
        outcomes = sum(1 for o in view.outcomes() if o.state_id == state_id)
    ranked.sort(key=lambda r: r.expected_speedup, reverse=True)
    return StateDetail(state=state, outcomes=outcomes, optimizations=ranked)


def kb_stats(store: KBStore, kb_path: Path) -> KbStatsView:
    """The store's statistics of the whole KB."""
    return KbStatsView(kb_path=str(kb_path), stats=store.stats())


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
