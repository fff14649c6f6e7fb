"""Knowledge Base records: one pydantic model per concept, reused from the store to the MCP schemas.

The vocabulary of bottlenecks (`kb.vocabulary`, importable from here too) is what the seed KB, the
classifier and the agents all speak: a State's signature is a (primary, secondary) pair from its enums
plus metric ranges over the canonical metric names of `kb_mcp.harness.profile_model.KernelMetrics`.

Every model is built on first use (`defer_build`), not at import: a `kb-mcp kb` command pays only
for the records it reads (bench/startup_bench.py).
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, model_validator

from kb_mcp.kb.vocabulary import (
    ALL_ARCH,
    DEFAULT_MODE,
    DEFAULT_TRACK,
    SECONDARY_OF,
    Mode,
    Primary,
    Secondary,
    Track,
    Verdict,
)

# The vocabulary (`kb.vocabulary`) is importable from here, with the records built on it.
__all__ = [
    "ALL_ARCH", "CALIBRATION_FIELDS", "CALIBRATION_ROBUST_SCALE", "CandidateRecord", "ChangeRun", "ClientRates",
    "ClientStats", "Count", "DEFAULT_MODE", "DEFAULT_TRACK", "Finite", "KBStats", "Lesson", "MAX_COUNT", "MetricRange",
    "Mode", "NonNegative", "Optimization", "Outcome", "PRE_RUN_VERDICTS", "Primary", "SCHEMA_VERSION", "SECONDARY_OF",
    "Score", "ScoreStats", "Secondary", "Signature", "State", "Strength", "Track", "Transition", "Verdict",
    "calibration_terms", "legacy_strength", "options_digest", "stored_instant", "utcnow"
]

SCHEMA_VERSION = 1
"""Version of the KB file layout; bumped on any incompatible change of these records."""


def utcnow() -> datetime:
    """Timezone-aware now, so timestamps in KB files compare and sort correctly."""
    return datetime.now(timezone.utc)


def stored_instant(value: Any) -> datetime:
    """A stored record's time (ISO text, or a datetime), comparable with any other: a time without a
    zone is UTC; the epoch for a value that is neither."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            value = None
    if not isinstance(value, datetime):
        return datetime.fromtimestamp(0, timezone.utc)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


MAX_COUNT = 2**53
"""The largest count a record may hold: beyond it a JSON number is no longer an exact integer, and
no KB ever recorded that many outcomes."""

Finite = Annotated[float, Field(allow_inf_nan=False)]
"""A number that statistics can be built on (NaN or infinity would spread into every sum it joins)."""
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
"""A finite weight or sum of squares."""
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
"""How many records of some kind were counted."""


def _client_stats_valid(stats: list[float]) -> list[float]:
    if stats[0] < 0 or stats[2] < 0:
        raise ValueError("a client's [weight, mean, m2] needs weight >= 0 and m2 >= 0")
    return stats


ClientStats = Annotated[list[Finite], Field(min_length=3, max_length=3), AfterValidator(_client_stats_valid)]
"""One client's share of a score: [weight, mean log-speedup, m2], finite, weight and m2 >= 0."""
ClientRates = Annotated[list[NonNegative], Field(min_length=2, max_length=2)]
"""One client's attempts behind a score's success chance: [ok weight, fail weight], finite, >= 0."""





class MetricRange(BaseModel):
    """Closed interval on one canonical metric; None leaves that side open."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    metric: str
    min: float | None = None
    max: float | None = None

    def contains(self, value: float) -> bool:
        """True when `value` lies inside the range."""
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


class Signature(BaseModel):
    """What defines a performance state: bottleneck pair plus the metric ranges seen there."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    primary: Primary
    secondary: Secondary | None = None
    ranges: list[MetricRange] = Field(default_factory=list)

    @property
    def key(self) -> str:
        """Exact-match key, e.g. 'memory/dram_bandwidth'."""
        return f"{self.primary.value}/{self.secondary.value if self.secondary else '-'}"


class State(BaseModel):
    """A performance state: what limits a kernel, and how we recognise it."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    id: str
    name: str
    description: str
    signature: Signature
    origin: Literal["seed", "discovered", "imported"] = "seed"
    parent_id: str | None = None  # for a discovered state: the nearest state it inherited from
    created_at: datetime = Field(default_factory=utcnow)


class Optimization(BaseModel):
    """A code transformation an agent can apply, with what it costs and when it helps.

    The text of an agent-made optimization (origin `agent` or `campaign`) is untrusted: other
    agents are shown it only once a verified outcome backs it, marked as KB content.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    id: str
    name: str
    description: str  # what to change in the code
    category: str  # e.g. memory_access, parallelism, fusion, compute, occupancy, launch, algorithm
    when_helps: str = ""
    cost: str = ""  # complexity, register/shared-memory price, correctness risks
    applicable_states: list[str] = Field(default_factory=list)
    follow_ups: list[str] = Field(default_factory=list)  # optimization ids that often pay off next
    origin: Literal["seed", "agent", "campaign", "imported"] = "seed"
    author: str = ""  # for an agent's or campaign's optimization: the client that described it
    outcome_id: str | None = None  # the outcome that introduced it (agent-made optimizations)
    deprecated: bool = False
    created_at: datetime = Field(default_factory=utcnow)


class ChangeRun(BaseModel):
    """Consecutive outcomes of one client that all landed on one side of a score's estimate.

    `cusum` is the one-sided cumulative sum of their standardized distances from the estimate (less
    an allowance per outcome); when it crosses a threshold the truth has likely changed, and that
    client's older samples give way to the run (`kb_mcp.policy.update`)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    client: str
    cusum: Finite  # signed: above (> 0) or below (< 0) the estimate
    n: Count  # outcomes in the run
    mean: Finite  # their mean log-speedup, as measured (not clipped)


class Score(BaseModel):
    """Statistics of one optimization in one state on one GPU arch family (or ALL_ARCH, pooled) and
    one precision track.

    Speedups are tracked in log space (weighted Welford mean and M2), so pooling two scores is exact
    and a 2x gain and a 0.5x loss cancel. The plain counters (`samples`, `attempts`, ...) count every
    outcome ever recorded; the weights behind the mean are bounded (per client and in total, see
    `kb_mcp.policy.update`), so the KB follows drift and no single client dominates a score.

    Its numbers are finite, and its counts, weights and sums of squares never negative: one NaN
    would spread into every sum it joins. A Score from another KB file is checked against this
    (`kb.tables.decode_score(validate=True)`); the KB's own rows are not, on their hot path.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    state_id: str
    optimization_id: str
    arch: str = ALL_ARCH
    track: Track = DEFAULT_TRACK
    mean_log_speedup: Finite = 0.0
    m2_log_speedup: NonNegative = 0.0  # weighted sum of squared deviations (Welford), for the variance
    samples: Count = 0  # valid timed outcomes ever recorded
    attempts: Count = 0  # every recorded outcome, failures included
    successes: Count = 0  # outcomes faster than the kernel they started from
    compile_failures: Count = 0
    verify_failures: Count = 0  # incorrect or invalid
    weight: NonNegative = 0.0  # effective number of samples behind the mean and M2 (bounded; = samples in old files)
    ok_weight: NonNegative = 0.0  # effective number of attempts that compiled and verified (the sum over `rates`)
    fail_weight: NonNegative = 0.0  # effective number of attempts that did not (the sum over `rates`)
    clients: dict[str, ClientStats] = Field(default_factory=dict)  # client name -> [weight, mean, m2]
    # client name -> [ok weight, fail weight], bounded per client and in total like `clients`
    rates: dict[str, ClientRates] = Field(default_factory=dict)
    run: ChangeRun | None = None  # the latest outcomes that lie on one side of the estimate (change detection)
    prior: bool = True  # True while the numbers are the seed's priors, not measurements
    prior_mean_log_speedup: Finite = 0.0
    prior_weight: NonNegative = 1.0  # how many pseudo-samples the prior counts for
    updated_at: datetime = Field(default_factory=utcnow)

    @model_validator(mode="before")
    @classmethod
    def _weights_of_counts(cls, data: object) -> object:
        """A score written before weights existed: every sample and failure counts once."""
        if isinstance(data, dict) and "weight" not in data:
            samples = int(data.get("samples") or 0)
            failures = int(data.get("compile_failures") or 0) + int(data.get("verify_failures") or 0)
            data = {**data, "weight": float(samples), "ok_weight": float(samples), "fail_weight": float(failures)}
            if samples and "clients" not in data:
                data["clients"] = {
                    "": [float(samples), float(data.get("mean_log_speedup") or 0.0),
                         float(data.get("m2_log_speedup") or 0.0)]
                }
        if isinstance(data, dict) and "rates" not in data and (data.get("ok_weight") or data.get("fail_weight")):
            # written before rates were kept per client: one unnamed client holds them all
            data = {**data, "rates": {"": [float(data.get("ok_weight") or 0.0), float(data.get("fail_weight") or 0.0)]}}
        return data

    @property
    def variance(self) -> float:
        """Sample variance of the log-speedup (0 with less than two samples' weight)."""
        return self.m2_log_speedup / (self.weight - 1.0) if self.weight > 1.0 else 0.0

    @property
    def posterior_mean_log_speedup(self) -> float:
        """Measured mean shrunk toward the prior mean by the prior's weight (log space)."""
        total = self.weight + self.prior_weight
        if total <= 0:
            return 0.0
        return (self.mean_log_speedup * self.weight + self.prior_mean_log_speedup * self.prior_weight) / total

    @property
    def expected_speedup(self) -> float:
        """Posterior expected speedup: measured mean shrunk toward the prior by its weight."""
        return math.exp(self.posterior_mean_log_speedup)

    @property
    def confidence(self) -> float:
        """0..1: how much the expected speedup rests on measurements rather than the prior."""
        return self.weight / (self.weight + self.prior_weight + 1.0)


class ScoreStats(NamedTuple):
    """The numbers of a Score that calibrating priors needs (`KBView.candidate_stats`); the field
    names are Score's own, so a Score serves wherever these do."""

    prior_mean_log_speedup: float
    mean_log_speedup: float
    m2_log_speedup: float
    weight: float
    prior_weight: float = 1.0


CALIBRATION_FIELDS = ("weight", "prior", "measured", "prior2", "cross", "measured2", "noise", "m2", "dof")
"""Sums the KB keeps per track over its measured pooled scores: v, v*p, v*m, v*p^2, v*p*m, v*m^2, v/W,
M2 and W-1 (p the prior mean, m the measured mean, W the weight behind it, v = W / (W + 1) times a
robust weight, `calibration_terms`): what the selection needs to judge how well priors predict
measurements (`kb_mcp.policy.select.Calibration`)."""


CALIBRATION_ROBUST_SCALE = 0.6
"""Distance (log units) between a score's measured and prior means beyond which its say in the
track's calibration fades (Student-t weight, 3 degrees of freedom): a few optimizations whose prior
was plain wrong, or whose truth changed, do not discredit every other prior."""


def calibration_terms(
    prior_mean: float, mean: float, m2: float, weight: float, prior_weight: float = 1.0
) -> tuple[float, ...]:
    """One score's contribution to the calibration sums (all zero without measurements). A prior
    that counts for nothing (`prior_weight` 0: retired when its score's truth changed) says nothing
    about how well priors predict; its score's spread still counts toward the noise."""
    if weight <= 0:
        return (0.0,) * len(CALIBRATION_FIELDS)
    v = weight / (weight + 1.0) * 3.0 / (3.0 + ((mean - prior_mean) / CALIBRATION_ROBUST_SCALE) ** 2)
    if prior_weight <= 0:
        v = 0.0
    p = prior_mean
    return (v, v * p, v * mean, v * p * p, v * p * mean, v * mean * mean, v / weight, max(m2, 0.0),
            max(weight - 1.0, 0.0))


class Lesson(BaseModel):
    """Free text learned about an optimization in a state, with who wrote it and from what.

    Lesson text is written by agents, so it is data, never instructions: other agents see it only
    when `outcome_id` names a verified outcome of the same state and optimization (a valid,
    unflagged verdict the server measured), and always marked as untrusted KB content.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    id: str
    state_id: str
    optimization_id: str
    arch: str = ALL_ARCH
    text: str
    source: Literal["seed", "agent", "campaign", "textual_gradient", "import"] = "agent"
    author: str = ""  # agent or client name
    candidate_id: str | None = None
    outcome_id: str | None = None  # the outcome it was learned from: what makes it verifiable
    created_at: datetime = Field(default_factory=utcnow)


class Outcome(BaseModel):
    """One entry of the replay buffer: an optimization applied in a state, and what it measured."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    id: str  # derived from (candidate_id, optimization_id): recording twice is a no-op
    problem: str
    candidate_id: str
    parent_candidate_id: str | None = None
    state_id: str
    next_state_id: str | None = None
    optimization_id: str
    arch: str
    track: Track = DEFAULT_TRACK  # the candidate verdict's track: the scores this outcome moved
    mode: Mode = DEFAULT_MODE  # the candidate verdict's mode (own kernels, or composed with the reference's ops)
    verdict: Verdict
    speedup: float | None = None  # over the kernel it started from; None unless verdict is valid
    speedup_vs_baseline: float | None = None  # over the better of eager and torch.compile
    tokens: int = 0
    agent: str = ""
    analysis: str = ""
    flagged: bool = False  # the candidate's verdict is held for review: kept here, moved no score
    created_at: datetime = Field(default_factory=utcnow)


class Transition(BaseModel):
    """How often applying `optimization_id` in `state_id` led to `next_state_id` (phase ordering)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    state_id: str
    optimization_id: str
    next_state_id: str
    count: Count = 0


def options_digest(options: dict[str, Any], device: str, arch: str) -> str:
    """Digest of what a verdict was checked with: the non-default options that bear on it, the GPU
    (or none, compile-only) and its arch. The verdicts of one candidate are stored under it."""
    canonical = json.dumps({"options": options, "device": device, "arch": arch}, sort_keys=True, separators=(",", ":"))
    return "v_" + hashlib.sha256(canonical.encode()).hexdigest()[:12]


class Strength(str, Enum):
    """What a stored verdict can claim, given the options it was checked with (weakest first).

    Only `standard` verdicts (and `compile_only` ones reached before anything ran) move scores;
    every other strength is kept under its own verdict key and shown, never credited. The
    options that lead to each strength are decided in `kb_mcp.harness.judgment.options.assess_options`.
    """

    loosened = "loosened"  # the caller relaxed a check (tolerance, allow-list, review threshold, limits)
    custom = "custom"  # stricter or other settings than the defaults (tighter limits, extra seeds, another arch)
    compile_only = "compile_only"  # default options, built but never run on a GPU
    quick = "quick"
    standard = "standard"  # on a GPU, full timing, every option at its default: what scores compare

    @property
    def rank(self) -> int:
        """Position in the order above (higher is stronger)."""
        return _STRENGTH_ORDER.index(self)


_STRENGTH_ORDER = (Strength.loosened, Strength.custom, Strength.compile_only, Strength.quick, Strength.standard)

PRE_RUN_VERDICTS = frozenset({Verdict.compile_error, Verdict.invalid, Verdict.needs_gpu})
"""Verdicts a compile-only check reaches as surely as a GPU run: the build, and the static checks."""


def legacy_strength(doc: dict[str, Any]) -> Strength:
    """The strength of a stored verdict written before verdict keys carried options: checked with the
    defaults, on a GPU where it names one (a device or its arch), else compile-only."""
    return Strength.standard if doc.get("device") or doc.get("arch") else Strength.compile_only


class CandidateRecord(BaseModel):
    """The server's own verdict on one candidate, as `compile_and_verify` measured it.

    `record_outcome` reads this record, never a number an agent reports, so a shared KB cannot
    be poisoned by a careless or dishonest agent.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    candidate_id: str
    problem: str
    problem_hash: str
    verdict: Verdict
    track: Track = DEFAULT_TRACK  # precision track the verdict was checked on (fp32 until the harness says otherwise)
    mode: Mode = DEFAULT_MODE  # own kernels only, or composed with the reference's own PyTorch ops (`Mode`)
    # Composed mode: the share of the candidate's GPU time in its own kernels (0..1); None where not measured
    coverage: float | None = None
    arch: str = ""  # e.g. sm_90; "" when no GPU verified it
    device: str = ""
    time_ms: float | None = None  # median candidate time
    eager_ms: float | None = None
    compile_ms: float | None = None  # torch.compile baseline, when measured
    speedup_vs_baseline: float | None = None  # over the better of eager and torch.compile
    # Device times (the summed GPU durations of one forward's kernels; `Timings`): shown beside
    # time_ms and eager_ms, which decide; None where unknown
    device_ms: float | None = None
    eager_device_ms: float | None = None
    flagged: bool = False  # held for review (implausible speedup, loosened options): never moves a score
    findings: list[str] = Field(default_factory=list)  # integrity finding codes
    # What its sandboxed processes (or its builds' flags) tried that the sandbox refuses: the
    # `sandbox_attempt` finding's text, from the server's own record (redacted); "" when none.
    attempt: str = ""
    # The verdict key (docs/architecture.md): the options that bear on the verdict and differ from
    # their defaults ({} = all defaults), what that lets the verdict claim, and their digest.
    options: dict[str, JsonValue] = Field(default_factory=dict)
    strength: Strength = Strength.standard
    loosened: list[str] = Field(default_factory=list)  # what the caller loosened, one note each
    options_digest: str = ""  # recomputed on every load from options, device and arch
    # The clients whose compile_and_verify produced this verdict (the same source verified again under
    # the same key adds its client): only they may record outcomes of the candidate
    # (`KBView.speaks_for`). Empty in records written before it was kept: unknown.
    verified_by: list[str] = Field(default_factory=list)
    # The KB file a verdict was merged in from (`kb merge`); None for this server's own. A merged verdict
    # is shown, but no outcome is measured from it here: only this server's own verdicts move scores.
    imported_from: str | None = None
    created_at: datetime = Field(default_factory=utcnow)

    @model_validator(mode="before")
    @classmethod
    def _legacy_strength(cls, data: object) -> object:
        # Records written before verdict keys carry no options: they were checked with the
        # defaults, on a GPU when they name one (a device or its arch), else compile-only.
        if isinstance(data, dict) and "strength" not in data:
            data = {**data, "strength": legacy_strength(data)}
        return data

    @model_validator(mode="after")
    def _digest(self) -> CandidateRecord:
        self.options_digest = options_digest(self.options, self.device, self.arch)
        return self

    @property
    def key(self) -> str:
        """Where this verdict is stored: `<candidate_id>/<options_digest>`."""
        return f"{self.candidate_id}/{self.options_digest}"

    @property
    def creditable(self) -> bool:
        """Whether `record_outcome` may move a score with this verdict: this server's own (not merged in
        from another KB file), checked with the default options and not held for review, on a GPU, or
        compile-only for a verdict reached before anything ran."""
        if self.flagged or self.loosened or self.imported_from is not None:
            return False
        return self.strength == Strength.standard or (
            self.strength == Strength.compile_only and self.verdict in PRE_RUN_VERDICTS
        )

    @property
    def order(self) -> tuple[int, datetime]:
        """Sort key: the strongest verdict last, the newest among equals."""
        return (self.strength.rank, self.created_at)


class KBStats(BaseModel):
    """Sizes and activity of a KB, for `kb-mcp kb stats` and the `kb://stats` resource."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int
    states: dict[str, int] = Field(default_factory=dict)  # by origin
    optimizations: dict[str, int] = Field(default_factory=dict)  # by origin
    scores: int = 0
    measured_scores: int = 0  # scores with at least one recorded outcome
    arch_families: list[str] = Field(default_factory=list)
    tracks: list[str] = Field(default_factory=list)  # precision tracks holding scores
    outcomes: dict[str, int] = Field(default_factory=dict)  # by verdict
    flagged_outcomes: int = 0
    lessons: int = 0
    transitions: int = 0  # sum of transition counts
    candidates: int = 0  # candidates with a verdict stored
    candidates_removed: int = 0  # candidates whose verdicts left under their client's bound
