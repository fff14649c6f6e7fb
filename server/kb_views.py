"""Compact read-only views of the KB, for the MCP resources, `kb-mcp kb` browsing and the banner.

Views are pydantic models built from the store's own records (kb/models.py); they only select and
rank, never restate a record's fields under other names. Jobs have theirs in `server/job_views.py`, so
browsing the KB from the CLI does not load the job machinery.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.kb.models import (
    ALL_ARCH,
    DEFAULT_MODE,
    CandidateRecord,
    KBStats,
    Mode,
    Optimization,
    Outcome,
    Score,
    State,
    Verdict,
)
from kb_mcp.kb.provenance import UNTRUSTED_NOTICE, optimization_is_verified, quote, shown_lessons

if TYPE_CHECKING:
    from kb_mcp.kb.store import KBStore

MAX_LESSONS_SHOWN = 3


class StateSummary(BaseModel):
    """One line of kb://states."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    id: str
    name: str
    bottleneck: str  # signature key, e.g. memory/dram_bandwidth
    origin: str
    scored_optimizations: int
    outcomes: int


class StatesOverview(BaseModel):
    """kb://states."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    count: int
    states: list[StateSummary]


class RankedOptimization(BaseModel):
    """An optimization as seen from one state: the record, its score there (pooled over GPU
    families) with the two numbers derived from it, and the newest verified lessons (quoted as untrusted
    KB content with their provenance)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    optimization: Optimization
    score: Score
    expected_speedup: float
    confidence: float
    lessons: list[str] = Field(default_factory=list)


class StateDetail(BaseModel):
    """kb://state/{id}."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    state: State
    outcomes: int
    optimizations: list[RankedOptimization]
    kb_text_notice: str = UNTRUSTED_NOTICE


class KbStatsView(BaseModel):
    """kb://stats: the store's own statistics plus which file they describe."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    kb_path: str
    stats: KBStats


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
            if opt is None or not optimization_is_verified(view, opt):  # unverified agent text is not shown
                continue
            ranked.append(
                RankedOptimization(
                    optimization=opt,
                    score=score,
                    expected_speedup=round(score.expected_speedup, 4),
                    confidence=round(score.confidence, 4),
                    lessons=[
                        quote(x.text, author=x.author, source=x.source, outcome_id=x.outcome_id)
                        for x in shown_lessons(view, state_id, opt.id, MAX_LESSONS_SHOWN)
                    ],
                )
            )
        outcomes = sum(1 for o in view.outcomes() if o.state_id == state_id)
    ranked.sort(key=lambda r: r.expected_speedup, reverse=True)
    return StateDetail(state=state, outcomes=outcomes, optimizations=ranked)


def kb_stats(store: KBStore, kb_path: Path) -> KbStatsView:
    """The store's statistics of the whole KB."""
    return KbStatsView(kb_path=str(kb_path), stats=store.stats())


# -- candidates, outcomes, campaigns -----------------------------------------------------------------

MAX_ROWS = 200


class CandidateSummary(BaseModel):
    """One line of kb://candidates: the server's verdict on a candidate, briefly."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    candidate_id: str
    problem: str
    verdict: Verdict
    mode: Mode = Field(DEFAULT_MODE, description="own kernels, or composed with the reference's own PyTorch ops")
    coverage: float | None = Field(None, description="composed: the share of its GPU time in its own kernels")
    speedup_vs_baseline: float | None = None
    time_ms: float | None = None
    device: str = ""
    flagged: bool = False
    findings: list[str] = Field(default_factory=list, description="the verdict's finding codes (why it is flagged)")
    attempt: str | None = Field(None, description="what the candidate tried that the sandbox refuses "
                                "(the sandbox_attempt finding), when it tried anything")
    outcomes: int = Field(0, description="outcomes recorded with this candidate")
    created_at: datetime


class CandidatesOverview(BaseModel):
    """kb://candidates: the newest candidates first."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    count: int = Field(description="candidates matching, before the limit")
    candidates: list[CandidateSummary]


class LineageStep(BaseModel):
    """One candidate on the way to (or from) another: how it was reached and what it measured."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    candidate_id: str
    verdict: Verdict | None = Field(None, description="None when the KB has no verdict for it")
    speedup_vs_baseline: float | None = None
    optimization_id: str | None = Field(None, description="the optimization credited with reaching this candidate")
    state_id: str | None = Field(None, description="the state it was optimized from")


class CandidateDetail(BaseModel):
    """kb://candidate/{id}: the verdict, the source, and the lineage of one candidate."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    record: CandidateRecord
    source: str | None = Field(None, description="the candidate's source as verified (None if not kept)")
    source_path: str | None = None
    source_removed: str | None = Field(None, description="why the source is not kept, where it was removed")
    lineage: list[LineageStep] = Field(
        default_factory=list,
        description="from the first kernel to this candidate, each with the optimization that made it"
    )
    children: list[LineageStep] = Field(default_factory=list, description="candidates made from this one")
    outcomes: list[Outcome] = Field(default_factory=list)


class OutcomesOverview(BaseModel):
    """kb://outcomes: the newest outcomes first."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    count: int = Field(description="outcomes matching, before the limit")
    outcomes: list[Outcome]


class CampaignRow(BaseModel):
    """One line of kb://campaigns."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    name: str
    folder: str
    state: str
    message: str = ""
    problems: int = 0
    runs: int = 0
    updated_at: datetime | None = None
    report: str | None = Field(None, description="the report's Markdown file, once written")


class CampaignsOverview(BaseModel):
    """kb://campaigns: the campaigns kept beside this KB."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    campaigns: list[CampaignRow]


def candidates_overview(
    store: KBStore, *, problem: str | None = None, verdict: str | None = None, flagged: bool = False, limit: int = 50
) -> CandidatesOverview:
    """Stored candidate verdicts, newest first, optionally of one problem or one verdict, or only
    those `flagged` for review."""
    with store.read() as view:
        records = [
            r for r in view.list_candidates()
            if (problem is None or r.problem == problem) and (verdict is None or r.verdict.value == verdict)
            and (r.flagged or not flagged)
        ]
        counts = Counter(o.candidate_id for o in view.outcomes())
    records.sort(key=lambda r: r.created_at, reverse=True)
    rows = [
        CandidateSummary(
            candidate_id=r.candidate_id, problem=r.problem, verdict=r.verdict, mode=r.mode, coverage=r.coverage,
            speedup_vs_baseline=r.speedup_vs_baseline,
            time_ms=r.time_ms, device=r.device, flagged=r.flagged, findings=r.findings, attempt=r.attempt or None,
            outcomes=counts[r.candidate_id],
            created_at=r.created_at,
        )
        for r in records[: min(limit, MAX_ROWS)]
    ]
    return CandidatesOverview(count=len(records), candidates=rows)


def resolve_candidate_id(store: KBStore, text: str) -> list[str]:
    """Candidate ids equal to `text` or starting with it (so a short prefix names a candidate)."""
    with store.read() as view:
        if view.get_candidate(text) is not None:
            return [text]
        return sorted(r.candidate_id for r in view.list_candidates() if r.candidate_id.startswith(text))


def candidate_detail(store: KBStore, candidates_dir: Path, candidate_id: str) -> CandidateDetail | None:
    """One candidate's verdict, kept source and lineage (None when the KB has no such candidate)."""
    with store.read() as view:
        record = view.get_candidate(candidate_id)
        if record is None:
            return None
        outcomes = view.outcomes()
        made_by: dict[str, Outcome] = {}
        for o in outcomes:  # oldest first: the first outcome that reached a candidate names its parent
            made_by.setdefault(o.candidate_id, o)
        verdicts = {r.candidate_id: r for r in view.list_candidates()}

    def step(cid: str, via: Outcome | None) -> LineageStep:
        rec = verdicts.get(cid)
        return LineageStep(
            candidate_id=cid, verdict=rec.verdict if rec else None,
            speedup_vs_baseline=rec.speedup_vs_baseline if rec else None,
            optimization_id=via.optimization_id if via else None, state_id=via.state_id if via else None,
        )

    ancestors: list[LineageStep] = []
    seen = {candidate_id}
    parent = made_by[candidate_id].parent_candidate_id if candidate_id in made_by else None
    while parent is not None and parent not in seen:  # a cycle in agent-written parents ends the walk
        seen.add(parent)
        ancestors.append(step(parent, made_by.get(parent)))
        parent = made_by[parent].parent_candidate_id if parent in made_by else None
    ancestors.reverse()
    lineage = [*ancestors, step(candidate_id, made_by.get(candidate_id))]
    children = [step(o.candidate_id, o) for o in outcomes if o.parent_candidate_id == candidate_id]
    path = candidates_dir / f"{candidate_id}.py"
    source = path.read_text() if path.is_file() else None
    from kb_mcp.tools.candidate_store import removed_note  # the one place that says why a source went

    return CandidateDetail(
        record=record, source=source, source_path=str(path) if source is not None else None,
        source_removed=removed_note(record) if source is None else None,
        lineage=lineage, children=children, outcomes=[o for o in outcomes if o.candidate_id == candidate_id],
    )


def outcomes_overview(
    store: KBStore, *, state: str | None = None, problem: str | None = None, limit: int = 50
) -> OutcomesOverview:
    """Recorded outcomes, newest first, optionally of one state or one problem."""
    with store.read() as view:
        rows = [
            o for o in view.outcomes()
            if (state is None or o.state_id == state) and (problem is None or o.problem == problem)
        ]
    rows.reverse()
    return OutcomesOverview(count=len(rows), outcomes=rows[: min(limit, MAX_ROWS)])


def campaigns_overview(artifacts_dir: Path) -> CampaignsOverview:
    """The campaigns in `<artifacts>/campaigns/`, most recently updated first; unreadable ones say so."""
    from kb_mcp.campaign.models import CampaignStatus

    rows: list[CampaignRow] = []
    root = artifacts_dir / "campaigns"
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        header = folder / "campaign.json"
        if not header.is_file():
            continue
        report = folder / "report" / "report.md"
        try:
            status = CampaignStatus.model_validate_json(header.read_text())
        except (OSError, ValueError) as exc:
            rows.append(CampaignRow(name=folder.name, folder=str(folder), state="unreadable",
                                        message=str(exc)[:200]))
            continue
        rows.append(
            CampaignRow(
                name=folder.name, folder=str(folder), state=status.state, message=status.message,
                problems=len(status.config.problems), runs=status.runs, updated_at=status.updated_at,
                report=str(report) if report.is_file() else None,
            )
        )
    rows.sort(key=lambda r: r.updated_at.timestamp() if r.updated_at else 0.0, reverse=True)
    return CampaignsOverview(campaigns=rows)
