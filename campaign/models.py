"""Records of a campaign: its configuration and the raw results of every unit of work.

A campaign's truth is its raw records: one file per initial generation, per rollout step and per
textual-gradient batch. The report, the best kernels and the resume point are all recomputed from
them, never kept as separate running totals that could drift.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from kb_mcp.campaign.agent_gradient import ParameterUpdate, PerfGapAnalysis, PolicyEvaluation
from kb_mcp.clients.llm import TokenLedger
from kb_mcp.kb.models import DEFAULT_TRACK, CandidateRecord, Track, Verdict, utcnow
from kb_mcp.policy.kb_edits import RejectedEdit
from kb_mcp.policy.select import DEFAULT_TEMPERATURE

CAMPAIGN_FORMAT: Final = "kb-mcp-campaign"
CAMPAIGN_VERSION = 1


def problem_name(path: str) -> str:
    """A problem's name in a campaign: its file name without `.py` (unique within a campaign)."""
    return Path(path).stem


class CampaignConfig(BaseModel):
    """What a campaign runs. Defaults follow the method's paper: 10 iterations x 10 rollout steps."""

    model_config = ConfigDict(extra="forbid")

    problems: list[str] = Field(description="Problem files (KernelBench format), resolved to absolute paths.")
    iterations: int = Field(10, ge=1, description="Rollout trajectories per problem.")
    steps: int = Field(10, ge=1, description="Optimization steps per trajectory.")
    parallel: int = Field(1, ge=1, description="Trajectories run at once (one per GPU is sensible).")
    top_k: int = Field(4, ge=1, le=10, description="Suggestions asked of the KB per step (the first is applied).")
    temperature: float = Field(
        DEFAULT_TEMPERATURE, ge=0.0, le=5.0,
        description="Spread of the draw from the KB's posterior: 1 = plain posterior sampling, 0 = greedy.",
    )
    fix_attempts: int = Field(3, ge=1, description="Candidates per lowering step (first try plus fixes).")
    generate_attempts: int = Field(4, ge=1, description="Candidates for the initial kernel (first try plus fixes).")
    answer_retries: int = Field(2, ge=0, description="Re-asks of a model whose answer could not be parsed.")
    gradient_every: int = Field(8, ge=0, description="Textual-gradient KB update every U recorded outcomes; 0 = off.")
    review: bool = Field(True, description="Soft verification (LLM review) before a result is accepted.")
    compile_only: bool = Field(False, description="No GPU: compile with error feedback, record, no timing.")
    fallback_state: str | None = Field(
        None,
        description="State used when no profile is available (compile-only runs); None: the state the "
        "reference's own operations point to (kb_mcp.policy.structure).",
    )
    seed: int = 0
    arch: str | None = Field(None, description="GPU arch for KB scores; None: what the harness reports.")
    models: dict[str, str] = Field(default_factory=dict, description="Model per role, for the record.")
    kind: Literal["campaign", "eval"] = Field(
        "campaign", description="An LLM campaign, or an eval of given solution files (`kb-mcp eval`)."
    )
    track: Track = Field(DEFAULT_TRACK, description="Precision track the candidates are verified in.")

    def changes_from(self, old: CampaignConfig) -> list[str]:
        """What this configuration sets otherwise than `old` (a stored run's), one `name: old -> new`
        per setting (per role for the models): what a resumed run says it changed."""
        changes: list[str] = []
        mine, theirs = self.model_dump(mode="json"), old.model_dump(mode="json")
        for name, value in mine.items():
            before = theirs.get(name)
            if name == "models":
                before = before or {}
                changes += [f"model for {role}: {before.get(role)} -> {model}" for role, model in sorted(value.items())
                            if before.get(role) != model]
            elif name == "problems":
                changes += _problem_changes(list(before or []), value)
            elif before != value:
                changes.append(f"{name}: {before} -> {value}")
        return changes


def _problem_changes(before: list[str], after: list[str]) -> list[str]:
    """The problems only one of two problem lists holds, by name and path."""
    gone = [p for p in before if p not in after]
    new = [p for p in after if p not in before]
    return ([f"problems only the campaign holds: {', '.join(gone)}"] if gone else []) + (
        [f"problems only given now: {', '.join(new)}"] if new else [])


class ReviewRecord(BaseModel):
    """Soft verification of one candidate."""

    model_config = ConfigDict(extra="forbid")

    accepted: bool
    issues: list[str] = Field(default_factory=list)
    summary: str = ""
    error: str | None = None  # the reviewer gave no usable answer (the candidate is then not accepted)


_FLAT_ATTEMPT = ("candidate_id", "verdict", "time_ms", "eager_ms", "compile_ms", "speedup_vs_baseline", "flagged",
                 "findings", "arch")


class AttemptRecord(BaseModel):
    """One candidate through compile_and_verify: the server's stored record of its verdict, and what
    the campaign made of it."""

    model_config = ConfigDict(extra="forbid")

    record: CandidateRecord  # as compile_and_verify stored and returned it
    feedback: str = ""  # what the harness said, as sent back to the model
    review: ReviewRecord | None = None  # soft verification of this candidate, when it was usable
    wall_s: float = 0.0

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        # Campaigns recorded before the record was embedded kept its fields flat: read them as one.
        if isinstance(data, dict) and "record" not in data and "candidate_id" in data:
            flat = {k: data[k] for k in _FLAT_ATTEMPT if k in data}
            rest = {k: v for k, v in data.items() if k not in _FLAT_ATTEMPT}
            return {**rest, "record": {"problem": "", "problem_hash": "", **flat}}
        return data

    @property
    def candidate_id(self) -> str:
        """The candidate's id (its record's)."""
        return self.record.candidate_id

    @property
    def verdict(self) -> Verdict:
        """The stored verdict."""
        return self.record.verdict


class KBSnapshot(BaseModel):
    """Size of the KB at one moment: what KB growth is plotted from."""

    model_config = ConfigDict(extra="forbid")

    states: int
    discovered_states: int
    optimizations: int
    deprecated_optimizations: int
    lessons: int
    outcomes: int
    measured_scores: int  # scores with at least one measured sample or attempt
    bytes: int  # the KB file (and its journal) on disk
    at: datetime = Field(default_factory=utcnow)


class SuggestionRecord(BaseModel):
    """One optimization offered by weighted top-k selection."""

    model_config = ConfigDict(extra="forbid")

    optimization_id: str
    expected_speedup: float | None = None
    confidence: float | None = None


class UnitRecord(BaseModel):
    """What initial generation and rollout steps share: candidates tried, the final one, its review, cost."""

    model_config = ConfigDict(extra="forbid")

    problem: str
    attempts: list[AttemptRecord] = Field(default_factory=list)
    review: ReviewRecord | None = None
    accepted: bool = False  # became the current kernel of its trajectory (initial: the start kernel)
    tokens: TokenLedger = Field(default_factory=TokenLedger)
    error: str | None = None
    kb: KBSnapshot | None = None
    wall_s: float = 0.0
    finished_at: datetime = Field(default_factory=utcnow)

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        # The final candidate's id and verdict are its stored record's (written out for readers of
        # the files, read back from the record, never from a copy).
        if isinstance(data, dict) and ("candidate_id" in data or "verdict" in data):
            return {k: v for k, v in data.items() if k not in ("candidate_id", "verdict")}
        return data

    @property
    def final(self) -> AttemptRecord | None:
        """The attempt of the final candidate."""
        return self.attempts[-1] if self.attempts else None

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented spelling; mypy cannot type it
    @property
    def candidate_id(self) -> str | None:
        """The final candidate of this unit."""
        return self.final.record.candidate_id if self.final else None

    @computed_field  # type: ignore[prop-decorator]  # as above
    @property
    def verdict(self) -> Verdict | None:
        """The stored verdict of the final candidate."""
        return self.final.record.verdict if self.final else None


class InitialRecord(UnitRecord):
    """Initial CUDA generation for one problem."""

    kind: Literal["initial"] = "initial"
    problem_hash: str
    problem_path: str


class StepRecord(UnitRecord):
    """One rollout step: profile, classify, select, lower, verify, review, record."""

    kind: Literal["step"] = "step"
    iteration: int
    step: int
    parent_candidate_id: str
    parent_time_ms: float | None = None
    profile_id: str | None = None
    state_id: str | None = None
    state_source: Literal["classified", "fallback"] | None = None
    suggestions: list[SuggestionRecord] = Field(default_factory=list)
    optimization_id: str | None = None
    predicted_speedup: float | None = None
    speedup_vs_parent: float | None = None
    next_state_id: str | None = None  # state of the accepted candidate (its profile feeds the next step)
    next_profile_id: str | None = None
    outcome_recorded: bool = False
    outcome_note: str = ""

    @property
    def key(self) -> str:
        """Unique name of the step within its campaign."""
        return f"{self.problem}/i{self.iteration:03d}/s{self.step:03d}"

    def headline(self) -> str:
        """One line for progress: the step, its optimization, and how it ended."""
        what = f"i{self.iteration} s{self.step} {self.optimization_id or '-'}"
        if self.error:
            return f"{what}: {self.error[:80]}"
        verdict = self.verdict.value if self.verdict else "-"
        gain = f" {self.speedup_vs_parent:.2f}x" if self.speedup_vs_parent else ""
        if self.review is not None and not self.review.accepted:
            return f"{what}: {verdict}{gain}, review rejected"
        return f"{what}: {verdict}{gain}{', accepted' if self.accepted else ''}"


class GradientRecord(BaseModel):
    """One textual-gradient update over a batch of recorded outcomes."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["gradient"] = "gradient"
    index: int
    step_keys: list[str]
    evaluation: PolicyEvaluation | None = None
    analysis: PerfGapAnalysis | None = None
    update: ParameterUpdate | None = None
    applied: list[dict[str, Any]] = Field(default_factory=list)
    rejected: list[RejectedEdit] = Field(default_factory=list)
    error: str | None = None
    tokens: TokenLedger = Field(default_factory=TokenLedger)
    kb_before: KBSnapshot | None = None
    kb_after: KBSnapshot | None = None
    finished_at: datetime = Field(default_factory=utcnow)


class CampaignStatus(BaseModel):
    """The campaign's header file: format, configuration, and how far it got."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["kb-mcp-campaign"] = CAMPAIGN_FORMAT
    version: int = CAMPAIGN_VERSION
    config: CampaignConfig
    kb_path: str
    # the server client that started it (`start_job`), as the KB names its clients: only it runs the
    # folder again, and it keeps its newest few (campaign.owners); None: the operator, from the shell
    client: str | None = None
    state: Literal["running", "stopped", "finished", "failed"] = "running"
    message: str = ""
    runs: int = 0  # how many times the campaign was started (1 + resumes)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class Retry(BaseModel):
    """A verification the cluster ran again: its worker died, was withdrawn, or lost its harness process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    problem: str
    candidate_id: str
    deaths: int = Field(description="workers lost while running it")
    withdrawn: list[str] = Field(default_factory=list, description="workers withdrawn under it (harness broken)")
    again: int = Field(0, description="times asked again after its worker's harness process was lost")


def retried_text(retried: Sequence[Retry]) -> str:
    """The report's line on verifications re-run after their worker died, or was withdrawn because its
    harness could not run, or lost its harness process ('' when none)."""
    def names(rs: Sequence[Retry]) -> str:
        return ", ".join(sorted({r.problem for r in rs}))

    died = [r for r in retried if r.deaths]
    broke = [r for r in retried if r.withdrawn]
    again = [r for r in retried if r.again and not r.deaths and not r.withdrawn]
    parts = []
    if died:
        parts.append(f"{len(died)} verification(s) re-run on another worker after theirs died: {names(died)}")
    if broke:
        workers = ", ".join(sorted({w for r in broke for w in r.withdrawn}))
        parts.append(f"{len(broke)} re-run on another worker after theirs could not run the harness and was "
                     f"withdrawn ({workers}): {names(broke)}")
    if again:
        parts.append(f"{len(again)} asked again after their worker's harness process was lost: {names(again)}")
    return "; ".join(parts)
