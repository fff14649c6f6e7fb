"""Whether a fast result is physically possible: the work census of a candidate and the bound it sets.

Plain data and arithmetic (no torch, no processes): the verify worker decides with it, the pool
carries a `WorkCensus` in `protocol.CensusReply`.

Two bounds, for two jobs:

* The *reference roofline* (`Timings.bound_ms`: the reference's FLOPs at the dtype's peak, the
  inputs and outputs through DRAM) says what computing the problem the reference's way would
  cost. A candidate below it, or faster than `implausible_speedup` times the best baseline, is
  not rejected for it: it may have found less work to do (an exact algebraic rewrite: a sum over
  a linear layer's outputs is `x . colsum(W) + sum(b)`). It *escalates* (`escalation_reasons`):
  the worker gathers more evidence (`harness.worker.evidence`).
* The *work bound* (`work_bound`) says how fast the candidate's own measured work could run:
  its kernels' DRAM bytes at the device's peak bandwidth, or their executed warp instructions
  at the device's peak issue rate (four per SM per cycle at the boost clock), whichever is
  longer. The counts come from Nsight Compute on one forward (`profiling.work`). A median time
  below `WORK_MARGIN` of it means the timed calls did less than the profiled call did:
  `impossible_time`, a cheat.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness.judgment.verdict import Finding, FindingCode, Timings
from kb_mcp.harness.profile_model import KernelProfile

__all__ = [
    "DevicePeaks",
    "KernelWork",
    "WorkBound",
    "WorkCensus",
    "ESCALATION_ROOFLINE",
    "WORK_MARGIN",
    "escalation_reasons",
    "impossible_time",
    "plausibility_findings",
    "unsettled",
    "work_bound",
    "work_census_from_profiles",
]

# A candidate timed below this fraction of the reference roofline escalates (the old hold's margin).
ESCALATION_ROOFLINE = 0.9
# A median below this fraction of the candidate's own work bound is impossible. Honest kernels
# reach at most ~93 % of the DRAM peak the bound uses (H100: ~3.1 of 3.35 TB/s); the margin
# leaves room for counter and clock noise on top of that.
WORK_MARGIN = 0.75
# Warp instructions one SM can issue per cycle: four schedulers (every NVIDIA GPU since Maxwell).
ISSUE_PER_SM_CYCLE = 4
# The SM clock assumed when the device does not report one: above any shipping GPU's boost clock,
# so the bound it gives is never too high.
FALLBACK_SM_CLOCK_HZ = 3.0e9

DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
WARP_INSTRUCTIONS = "smsp__inst_executed.sum"
DURATION = "gpu__time_duration.sum"
WORK_METRICS = (DRAM_READ, DRAM_WRITE, WARP_INSTRUCTIONS, DURATION)


class KernelWork(BaseModel):
    """What one kernel of the profiled forward did, from its hardware counters."""

    model_config = ConfigDict(extra="forbid")

    name: str
    dram_read_bytes: float | None = None
    dram_write_bytes: float | None = None
    warp_instructions: float | None = None
    duration_ns: float | None = None  # under the profiler (base clocks, flushed caches): not a timing


class WorkCensus(BaseModel):
    """The work one forward of the candidate did: its kernels' DRAM bytes and instructions."""

    model_config = ConfigDict(extra="forbid")

    available: bool
    kernels: list[KernelWork] = Field(default_factory=list)
    note: str = ""  # why it is unavailable, or what limits it (a launch cap)
    wall_s: float | None = None

    @property
    def dram_bytes(self) -> float:
        """DRAM bytes read and written, all kernels."""
        return sum((k.dram_read_bytes or 0.0) + (k.dram_write_bytes or 0.0) for k in self.kernels)

    @property
    def warp_instructions(self) -> float:
        """Warp instructions executed, all kernels."""
        return sum(k.warp_instructions or 0.0 for k in self.kernels)


class DevicePeaks(BaseModel):
    """What the device can do at most (from its properties; None where it does not say)."""

    model_config = ConfigDict(extra="forbid")

    dram_bytes_per_s: float | None = None
    sm_count: int | None = None
    sm_clock_hz: float | None = None  # boost clock; None: FALLBACK_SM_CLOCK_HZ
    l2_bytes: int = 0

    @property
    def issue_per_s(self) -> float | None:
        """Warp instructions per second the whole device can issue."""
        if not self.sm_count:
            return None
        return self.sm_count * ISSUE_PER_SM_CYCLE * (self.sm_clock_hz or FALLBACK_SM_CLOCK_HZ)


class WorkBound(BaseModel):
    """The fastest the candidate's own work could run, and which limit sets it."""

    model_config = ConfigDict(extra="forbid")

    ms: float
    dram_ms: float | None = None
    issue_ms: float | None = None
    dram_bytes: float = 0.0  # the bytes the bound counts (see `work_bound`)
    warp_instructions: float = 0.0
    kernels: int = 0

    @property
    def limit(self) -> str:
        """`dram` or `issue`: the larger of the two."""
        return "dram" if (self.dram_ms or 0.0) >= (self.issue_ms or 0.0) else "issue"

    def describe(self) -> str:
        """One line: the bound and what it is made of."""
        parts = []
        if self.dram_ms is not None:
            parts.append(f"{self.dram_bytes / 1e6:.3g} MB through DRAM: {self.dram_ms * 1e3:.3g} us")
        if self.issue_ms is not None:
            parts.append(f"{self.warp_instructions:.3g} warp instructions: {self.issue_ms * 1e3:.3g} us")
        plural = "s" if self.kernels != 1 else ""
        return f"{self.ms * 1e3:.3g} us over {self.kernels} kernel{plural} ({'; '.join(parts)})"


def work_census_from_profiles(kernels: list[KernelProfile], note: str = "") -> WorkCensus:
    """A work census from the kernels of an Nsight Compute profile (`ncu_parse.parse_ncu_csv`)."""
    out = []
    for k in kernels:
        extra = k.metrics.extra
        out.append(KernelWork(
            name=k.name,
            dram_read_bytes=extra.get(DRAM_READ),
            dram_write_bytes=extra.get(DRAM_WRITE),
            warp_instructions=extra.get(WARP_INSTRUCTIONS),
            duration_ns=k.metrics.duration_ns,
        ))
    return WorkCensus(available=True, kernels=out, note=note)


def work_bound(census: WorkCensus | None, peaks: DevicePeaks) -> WorkBound | None:
    """The fastest time the census's work could take on a device with `peaks`; None if unknown.

    The counters come from a profiler that empties the caches before each kernel, as the timer
    empties L2 before each timed call. Within one timed call, though, a later kernel may find up
    to the L2's size of its data still cached by an earlier one, and up to that much of what a
    kernel writes may still sit in L2 when the call ends: each kernel's reads after the first, and
    every kernel's writes, count only beyond one L2's worth. The DRAM and issue limits are taken
    over the whole call (kernels on several streams may overlap), and the bound is the larger.
    """
    if census is None or not census.available or not census.kernels:
        return None
    l2 = float(peaks.l2_bytes)
    dram_bytes = 0.0
    have_bytes = all(k.dram_read_bytes is not None and k.dram_write_bytes is not None for k in census.kernels)
    for i, k in enumerate(census.kernels):
        reads = k.dram_read_bytes or 0.0
        dram_bytes += reads if i == 0 else max(0.0, reads - l2)
        dram_bytes += max(0.0, (k.dram_write_bytes or 0.0) - l2)
    instructions = census.warp_instructions
    have_insts = all(k.warp_instructions is not None for k in census.kernels)
    dram_ms = dram_bytes / peaks.dram_bytes_per_s * 1e3 if have_bytes and peaks.dram_bytes_per_s else None
    issue = peaks.issue_per_s
    issue_ms = instructions / issue * 1e3 if have_insts and issue else None
    if dram_ms is None and issue_ms is None:
        return None
    return WorkBound(ms=max(x for x in (dram_ms, issue_ms) if x is not None), dram_ms=dram_ms, issue_ms=issue_ms,
                     dram_bytes=dram_bytes, warp_instructions=instructions, kernels=len(census.kernels))


def escalation_reasons(timings: Timings, factor: float) -> list[str]:
    """Why a result needs more evidence before it counts (empty: it needs none)."""
    reasons = []
    s = timings.speedup_vs_baseline
    if s is not None and s > factor:
        reasons.append(f"speedup {s:.1f}x over the best baseline is above the review threshold of {factor:g}x")
    if timings.bound_ms is not None and timings.candidate_ms < ESCALATION_ROOFLINE * timings.bound_ms:
        reasons.append(f"{timings.candidate_ms * 1e3:.3g} us is below the reference's roofline "
                       f"({timings.bound_ms * 1e3:.3g} us: its FLOPs at peak, inputs and outputs through DRAM)")
    return reasons


def impossible_time(candidate_ms: float, bound: WorkBound) -> Finding | None:
    """`impossible_time` when the median is below `WORK_MARGIN` of the candidate's own work bound."""
    if candidate_ms >= WORK_MARGIN * bound.ms:
        return None
    return Finding(
        code=FindingCode.impossible_time, source="timing",
        message=(f"median time {candidate_ms * 1e3:.3g} us is below the fastest its own measured work could run: "
                 f"{bound.describe()}. The timed calls did less than the profiled call; every call must do "
                 "all of its work inside the call"),
    )


def unsettled(reasons: list[str], why: str) -> Finding:
    """The hold for a result that escalated but could not be settled (the reason says what would settle it)."""
    return Finding(
        code=FindingCode.implausible_speedup, source="timing",
        message=f"{'; '.join(reasons)}; held for review: {why}",
    )


def plausibility_findings(timings: Timings, factor: float) -> list[Finding]:
    """The hold of a result that escalates where no evidence can be gathered (a caller without a
    worker): one `implausible_speedup` finding naming the reasons, or none."""
    reasons = escalation_reasons(timings, factor)
    return [unsettled(reasons, "no further evidence was gathered")] if reasons else []
