"""The campaign report, recomputed from the raw per-unit records every time it is built.

Speedups follow KernelBench practice: over the better (faster) of eager PyTorch and torch.compile,
measured by the harness on the same GPU. Every figure is per precision track (the verdicts' own
`track`): the headline figures are those of the campaign's track, and `by_track` keeps each track's
apart, so that numbers of two tracks are never ranked together. A problem counts as valid once any of its candidates was
correct and timed (and not rejected by review or flagged as implausible). fast_p is the fraction of
*all* problems whose best kernel is valid and faster than p times the baseline.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.campaign.models import (
    CampaignConfig,
    GradientRecord,
    InitialRecord,
    KBSnapshot,
    Retry,
    StepRecord,
    UnitRecord,
    problem_name,
    retried_text,
)
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.clients.llm import TokenLedger
from kb_mcp.kb.models import Verdict

FAST_P_MARKS = (0.0, 0.5, 0.8, 1.0, 1.2, 1.5, 2.0, 3.0)
MAX_GROWTH_POINTS = 400


class SpeedupStats(BaseModel):
    """Summary of a set of speedups (None everywhere when the set is empty)."""

    model_config = ConfigDict(extra="forbid")

    n: int = 0
    geomean: float | None = None
    mean: float | None = None
    median: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> SpeedupStats:
        """Statistics of positive speedups."""
        vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
        if not vals:
            return cls()
        return cls(
            n=len(vals),
            geomean=math.exp(sum(math.log(v) for v in vals) / len(vals)),
            mean=statistics.fmean(vals),
            median=statistics.median(vals),
            min=min(vals),
            max=max(vals),
        )


class KernelPick(BaseModel):
    """A candidate chosen as some problem's initial or best kernel."""

    model_config = ConfigDict(extra="forbid")

    candidate_id: str
    time_ms: float | None
    device_ms: float | None = None  # its device time (shown beside time_ms, which ranks)
    origin: str  # "initial" or "iNNN/sNNN"
    verified: bool  # correct and timed on a GPU (False in compile-only runs)


class ProblemResult(BaseModel):
    """Per-problem times and speedups."""

    model_config = ConfigDict(extra="forbid")

    problem: str
    eager_ms: float | None = None
    compile_ms: float | None = None
    baseline_ms: float | None = None  # the faster of eager and torch.compile
    initial_ms: float | None = None
    best_ms: float | None = None
    initial_speedup: float | None = None  # over baseline_ms
    best_speedup: float | None = None
    best_vs_eager: float | None = None
    best_vs_compile: float | None = None
    # Device times beside the end-to-end ones above (which decide and rank): eager's, the best kernel's
    eager_device_ms: float | None = None
    best_device_ms: float | None = None
    best_vs_eager_device: float | None = None
    best: KernelPick | None = None
    initial_verdict: Verdict | None = None  # the harness's verdict on the first kernel (an eval's solution)
    valid: bool = False
    compiled: bool = False
    steps: int = 0
    valid_steps: int = 0
    improved_steps: int = 0
    tokens: int = 0
    track: str = "fp32"  # the precision track its verdicts were checked in
    mode: str = "own"  # own kernels, or composed with the reference's own ops (`VerifyOptions.mode`)
    coverage: float | None = None  # composed: the share of its first kernel's GPU time in its own kernels


class TrackSummary(BaseModel):
    """The headline figures of the problems of one precision track."""

    model_config = ConfigDict(extra="forbid")

    problems: int
    valid_rate: float
    speedup: SpeedupStats
    speedup_vs_eager: SpeedupStats
    speedup_vs_compile: SpeedupStats
    fast_p: dict[str, float]
    speedup_vs_eager_device: SpeedupStats = Field(default_factory=SpeedupStats)  # device times


class OptimizationUsage(BaseModel):
    """How one optimization fared when selected."""

    model_config = ConfigDict(extra="forbid")

    optimization_id: str
    selected: int = 0
    compiled: int = 0
    valid: int = 0
    improved: int = 0  # faster than the kernel it started from, and accepted
    compile_errors: int = 0
    verify_failures: int = 0  # incorrect or invalid
    review_rejected: int = 0
    success_rate: float = 0.0  # improved / selected
    geomean_speedup: float | None = None  # over the parent, valid outcomes only


class TransitionCount(BaseModel):
    """State before, optimization applied, state of the resulting kernel."""

    model_config = ConfigDict(extra="forbid")

    state_id: str
    optimization_id: str
    next_state_id: str
    count: int


class GradientSummary(BaseModel):
    """Textual-gradient batches and their edits."""

    model_config = ConfigDict(extra="forbid")

    batches: int = 0
    applied: int = 0
    rejected: int = 0
    applied_by_kind: dict[str, int] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)


class CampaignReport(BaseModel):
    """Everything the report shows; written as report.json."""

    model_config = ConfigDict(extra="forbid")

    mode: str  # "gpu" or "compile-only"
    config: CampaignConfig
    problems: list[ProblemResult]
    valid_rate: float  # problems with a valid kernel / problems
    step_valid_rate: float | None  # valid final candidates / steps
    compile_rate: float | None  # candidates that compiled / candidates
    candidates: int  # every candidate that went through compile_and_verify
    speedup: SpeedupStats  # best kernel over the better of eager and torch.compile
    speedup_vs_eager: SpeedupStats
    speedup_vs_compile: SpeedupStats
    initial_speedup: SpeedupStats
    speedup_vs_eager_device: SpeedupStats = Field(default_factory=SpeedupStats)  # device times
    fast_p: dict[str, float]  # threshold -> fraction of all problems
    optimizations: list[OptimizationUsage]
    state_visits: dict[str, int]
    transitions: list[TransitionCount]
    kb_growth: list[KBSnapshot]
    gradient: GradientSummary
    tokens: TokenLedger
    notes: list[str] = Field(default_factory=list)
    by_track: dict[str, TrackSummary] = Field(default_factory=dict)  # every track's figures, apart

    def run_label(self) -> str:
        """Where the run happened, as reports say it (`mode` keeps its stored values, "gpu" or
        "compile-only"; the word mode in a report means a problem's verification mode)."""
        return "compile only" if self.mode == "compile-only" else "on the GPU"

    def verification_modes(self) -> str:
        """How many problems each verification mode judged, e.g. "own kernels 13, composed 3" (a problem
        nothing was verified for, a solution missing, counts in neither)."""
        judged = [p for p in self.problems if p.initial_verdict is not None]
        composed = sum(1 for p in judged if p.mode == "composed")
        own = len(judged) - composed
        return ", ".join(f"{label} {n}" for label, n in (("own kernels", own), ("composed", composed)) if n)


def _timed_ms(unit: UnitRecord) -> float:
    """The time of a usable unit's final candidate (`usable` guarantees it has one)."""
    final = unit.final
    if final is None or final.record.time_ms is None:
        raise ValueError(f"{unit.candidate_id}: no timed final candidate")
    return final.record.time_ms


def usable(unit: UnitRecord) -> bool:
    """A final candidate that may count as a result: correct and timed, not rejected or flagged."""
    final = unit.final
    if final is None or unit.verdict is None or not unit.verdict.is_valid or final.record.time_ms is None:
        return False
    if final.record.flagged:
        return False
    return unit.review is None or unit.review.accepted


def _origin(unit: InitialRecord | StepRecord) -> str:
    return "initial" if isinstance(unit, InitialRecord) else f"i{unit.iteration:03d}/s{unit.step:03d}"


def pick_best(initial: InitialRecord | None, steps: Sequence[StepRecord]) -> KernelPick | None:
    """The best kernel of one problem.

    Timed runs: the fastest usable candidate. Compile-only runs (nothing timed): the last accepted
    candidate in trajectory order, marked unverified, so the file still shows how far lowering got.
    """
    units: list[InitialRecord | StepRecord] = ([initial] if initial else []) + list(steps)
    timed = [u for u in units if usable(u)]
    if timed:
        best, best_ms = min(((u, _timed_ms(u)) for u in timed), key=lambda pair: pair[1])
        device_ms = best.final.record.device_ms if best.final is not None else None
        return KernelPick(candidate_id=best.candidate_id or "", time_ms=best_ms, device_ms=device_ms,
                          origin=_origin(best), verified=True)
    accepted = [u for u in units if u.accepted and u.candidate_id]
    if not accepted:
        return None
    last = accepted[-1]
    return KernelPick(candidate_id=last.candidate_id or "", time_ms=None, origin=_origin(last), verified=False)


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _baselines(units: Iterable[UnitRecord]) -> tuple[float | None, float | None, float | None]:
    """The latest eager and torch.compile times, and eager's device time, any attempt of the problem measured."""
    eager = compiled = eager_device = None
    for unit in units:
        for attempt in unit.attempts:
            r = attempt.record
            eager = r.eager_ms if r.eager_ms is not None else eager
            compiled = r.compile_ms if r.compile_ms is not None else compiled
            eager_device = r.eager_device_ms if r.eager_device_ms is not None else eager_device
    return eager, compiled, eager_device


def problem_result(problem: str, initial: InitialRecord | None, steps: Sequence[StepRecord],
                   track: str = "fp32") -> ProblemResult:
    """Times and speedups of one problem from its raw records (`track`: the campaign's, for a
    problem with no verdict yet)."""
    units: list[UnitRecord] = ([initial] if initial else []) + list(steps)
    tracks = [a.record.track.value for u in units for a in u.attempts]
    modes = [a.record.mode for u in units for a in u.attempts]
    eager, compiled, eager_device = _baselines(units)
    present = [t for t in (eager, compiled) if t is not None]
    baseline = min(present) if present else None
    best = pick_best(initial, steps)
    initial_ms = initial.final.record.time_ms if initial is not None and usable(initial) else None  # type: ignore[union-attr]
    best_ms = best.time_ms if best is not None and best.verified else None
    best_device = best.device_ms if best is not None and best.verified else None
    tokens = TokenLedger()
    for unit in units:
        tokens.merge(unit.tokens)
    return ProblemResult(
        problem=problem,
        eager_ms=eager,
        compile_ms=compiled,
        baseline_ms=baseline,
        initial_ms=initial_ms,
        best_ms=best_ms,
        initial_speedup=_ratio(baseline, initial_ms),
        best_speedup=_ratio(baseline, best_ms),
        best_vs_eager=_ratio(eager, best_ms),
        best_vs_compile=_ratio(compiled, best_ms),
        eager_device_ms=eager_device,
        best_device_ms=best_device,
        best_vs_eager_device=_ratio(eager_device, best_device),
        best=best,
        initial_verdict=initial.verdict if initial is not None else None,
        valid=best_ms is not None,
        compiled=any(a.verdict != Verdict.compile_error for u in units for a in u.attempts),
        steps=len(steps),
        valid_steps=sum(1 for s in steps if usable(s)),
        improved_steps=sum(
            1 for s in steps if s.accepted and s.speedup_vs_parent is not None and s.speedup_vs_parent > 1),
        tokens=tokens.total.total,
        track=tracks[-1] if tracks else track,
        mode=modes[-1] if modes else "own",
        coverage=initial.final.record.coverage if initial is not None and initial.final is not None else None,
    )


def track_summary(results: Sequence[ProblemResult]) -> TrackSummary:
    """Valid rate, speedups and fast_p over `results` (all of one track)."""
    return TrackSummary(
        problems=len(results),
        valid_rate=sum(r.valid for r in results) / len(results) if results else 0.0,
        speedup=SpeedupStats.of([r.best_speedup for r in results if r.best_speedup is not None]),
        speedup_vs_eager=SpeedupStats.of([r.best_vs_eager for r in results if r.best_vs_eager is not None]),
        speedup_vs_compile=SpeedupStats.of([r.best_vs_compile for r in results if r.best_vs_compile is not None]),
        speedup_vs_eager_device=SpeedupStats.of([r.best_vs_eager_device for r in results
                                                 if r.best_vs_eager_device is not None]),
        fast_p={f"{p:g}": fast_p(results, p) for p in FAST_P_MARKS},
    )


def fast_p(results: Sequence[ProblemResult], threshold: float) -> float:
    """Fraction of all problems whose best kernel is valid and more than `threshold` times faster."""
    if not results:
        return 0.0
    hits = sum(1 for r in results if r.valid and r.best_speedup is not None and r.best_speedup > threshold)
    return hits / len(results)


def optimization_usage(steps: Sequence[StepRecord]) -> list[OptimizationUsage]:
    """Per optimization: how often selected, compiled, valid, improved; geomean speedup over parent."""
    usage: dict[str, OptimizationUsage] = {}
    speedups: dict[str, list[float]] = defaultdict(list)
    for s in steps:
        if s.optimization_id is None:
            continue
        u = usage.setdefault(s.optimization_id, OptimizationUsage(optimization_id=s.optimization_id))
        u.selected += 1
        if s.verdict is not None and s.verdict != Verdict.compile_error:
            u.compiled += 1
        if s.verdict == Verdict.compile_error:
            u.compile_errors += 1
        if s.verdict in (Verdict.incorrect, Verdict.invalid):
            u.verify_failures += 1
        if s.review is not None and not s.review.accepted:
            u.review_rejected += 1
        if usable(s):
            u.valid += 1
            if s.speedup_vs_parent is not None:
                speedups[s.optimization_id].append(s.speedup_vs_parent)
        if s.accepted and s.speedup_vs_parent is not None and s.speedup_vs_parent > 1:
            u.improved += 1
    for opt_id, u in usage.items():
        u.success_rate = u.improved / u.selected if u.selected else 0.0
        u.geomean_speedup = SpeedupStats.of(speedups[opt_id]).geomean
    return sorted(usage.values(), key=lambda u: (-u.selected, u.optimization_id))


def transitions(steps: Sequence[StepRecord]) -> list[TransitionCount]:
    """(state, optimization) -> state of the accepted kernel, as profiled and classified after the step.

    Only measured transitions count: compile-only runs (no profiles) have none.
    """
    counts: Counter[tuple[str, str, str]] = Counter(
        (s.state_id, s.optimization_id, s.next_state_id)
        for s in steps
        if s.accepted and s.state_id and s.optimization_id and s.next_state_id
    )
    return [
        TransitionCount(state_id=a, optimization_id=b, next_state_id=c, count=n)
        for (a, b, c), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def kb_growth(
    start: KBSnapshot | None,
    units: Sequence[UnitRecord],
    gradients: Sequence[GradientRecord],
) -> list[KBSnapshot]:
    """KB sizes over the campaign (start, after each first kernel, step and gradient batch), in time order."""
    points = [start] if start else []
    points += [u.kb for u in units if u.kb is not None]
    points += [g.kb_after for g in gradients if g.kb_after is not None]
    points.sort(key=lambda p: p.at)
    if len(points) <= MAX_GROWTH_POINTS:
        return points
    # A 100-problem campaign has ~10,000 snapshots: keep an even sample (and the last) for the plot.
    stride = len(points) / (MAX_GROWTH_POINTS - 1)
    return [points[int(i * stride)] for i in range(MAX_GROWTH_POINTS - 1)] + [points[-1]]


def build_report(
    config: CampaignConfig,
    initials: dict[str, InitialRecord],
    steps: Sequence[StepRecord],
    gradients: Sequence[GradientRecord],
    kb_start: KBSnapshot | None,
    problem_names: Sequence[str],
    retried: Sequence[Retry] = (),
) -> CampaignReport:
    """The whole report from raw records (nothing is carried over from earlier reports)."""
    by_problem: dict[str, list[StepRecord]] = defaultdict(list)
    for s in steps:
        by_problem[s.problem].append(s)
    results = [problem_result(name, initials.get(name), by_problem.get(name, []), config.track.value)
               for name in problem_names]
    grouped: dict[str, list[ProblemResult]] = defaultdict(list)
    for r in results:
        grouped[r.track].append(r)
    by_track = {t: track_summary(rs) for t, rs in sorted(grouped.items())}
    head = by_track.get(config.track.value) or track_summary([])
    attempts = [a for u in [*initials.values(), *steps] for a in u.attempts]
    tokens = TokenLedger()
    spenders: list[InitialRecord | StepRecord | GradientRecord] = [*initials.values(), *steps, *gradients]
    for unit in spenders:
        tokens.merge(unit.tokens)
    grad = GradientSummary(batches=len(gradients))
    kinds: Counter[str] = Counter()
    for g in gradients:
        grad.applied += len(g.applied)
        grad.rejected += len(g.rejected)
        kinds.update(str(e.get("kind")) for e in g.applied)
        if g.error:
            grad.errors.append(f"batch {g.index}: {g.error}")
    grad.applied_by_kind = dict(sorted(kinds.items()))
    notes: list[str] = []
    if config.kind == "eval":
        notes.append("eval: each problem's solution file verified once through compile_and_verify "
                     f"(track {config.track.value}); no LLM, no KB updates beyond the stored verdicts.")
    others = sorted({r.track for r in results} - {config.track.value})
    if others:
        notes.append(f"results of other precision tracks ({', '.join(others)}) are summarised apart (by_track), "
                     f"never ranked with the {config.track.value} ones above.")
    if config.compile_only:
        notes.append("compile-only run: candidates were compiled (verdict needs_gpu) but not verified or timed; "
                     "no speedups exist, and best kernels are the last accepted ones, unverified.")
    if config.gradient_every == 0 and config.kind == "campaign":
        notes.append("textual gradient off: the KB was updated numerically only.")
    if retried:  # every run's, as the folder keeps them
        notes.append(retried_text(retried))
    states = Counter(s.state_id for s in steps if s.state_id)
    return CampaignReport(
        mode="compile-only" if config.compile_only else "gpu",
        config=config,
        problems=results,
        valid_rate=head.valid_rate,
        step_valid_rate=sum(1 for s in steps if usable(s)) / len(steps) if steps else None,
        compile_rate=sum(1 for a in attempts if a.verdict != Verdict.compile_error) / len(attempts)
        if attempts
        else None,
        candidates=len(attempts),
        speedup=head.speedup,
        speedup_vs_eager=head.speedup_vs_eager,
        speedup_vs_compile=head.speedup_vs_compile,
        speedup_vs_eager_device=head.speedup_vs_eager_device,
        initial_speedup=SpeedupStats.of([r.initial_speedup for r in grouped.get(config.track.value, [])
                                         if r.initial_speedup is not None]),
        fast_p=head.fast_p,
        optimizations=optimization_usage(steps),
        state_visits=dict(states.most_common()),
        transitions=transitions(steps),
        kb_growth=kb_growth(kb_start, [*initials.values(), *steps], gradients),
        gradient=grad,
        tokens=tokens,
        notes=notes,
        by_track=by_track,
    )


def report_from_store(store: CampaignStore) -> CampaignReport:
    """Reads a campaign folder's raw records and builds its report."""
    status = store.read_status()
    if status is None:
        raise FileNotFoundError(f"{store.root} holds no campaign (no campaign.json)")
    return build_report(
        status.config,
        store.initials(),
        store.steps(),
        store.gradients(),
        store.kb_start(),
        [problem_name(p) for p in status.config.problems],
        store.retried(),
    )
