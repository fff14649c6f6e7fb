"""MCP tool `classify_state`: a profile (or raw metrics) -> KB performance states, with evidence."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kb_mcp.harness.profile_model import KernelMetrics, KernelProfile, Profile, RuleFinding
from kb_mcp.policy.classify import (
    Evidence,
    KernelClassification,
    RuleSupport,
    StateAssignment,
    assign_states,
    classify_profile,
)
from kb_mcp.profiling.profile_store import ProfileNotFound, ProfileStore
from kb_mcp.tools.base import Progress, ToolError, ToolMeta, no_progress
from kb_mcp.tools.context import ToolContext

NAME = "classify_state"
DESCRIPTION = """\
Map a profile to performance states of the shared Knowledge Base: what limits each heavy kernel and
the candidate as a whole. Pass the profile_id that profile_kernel returned (or, without a GPU profile,
one kernel's raw metrics). The rules are deterministic: which unit is near its peak (DRAM, caches,
FP32/tensor/special-function pipes), and which specific cause the counters show (uncoalesced loads,
shared-memory bank conflicts, register spills, hot atomics, warp divergence, matmul work with idle
tensor cores, register- or shared-memory-limited occupancy, too few blocks, many tiny launches,
several memory-bound passes that fusion would merge). Kernels come heaviest first, each with its
state id and name, primary/secondary bottleneck, confidence, and the evidence (metric, value,
threshold) plus the profiler findings that agree; a metric you do not give is unknown, never 0. A
signature no state has yet becomes a new discovered state (kb_grew=true), but only from metrics that
include sm_, memory_ and dram_throughput_pct (profile_kernel's always do). Next: suggest_optimizations
with the state_id of the heaviest kernel, or of `overall` when it names a whole-candidate problem
(launch overhead, redundant passes)."""

META = ToolMeta(
    title="Classify a profile into KB states",
    # Not read-only: a profile that matches no state adds a discovered state to the KB. Calling
    # again finds that state, so the call is idempotent.
    idempotent=True,
)


class Request(BaseModel):
    """A stored profile, or the metrics of one kernel."""

    model_config = ConfigDict(extra="forbid")

    profile_id: str | None = Field(None, description="id returned by profile_kernel")
    metrics: KernelMetrics | None = Field(
        None, description="raw metrics of one kernel (canonical names, base units), instead of a profile_id"
    )
    kernel_name: str = Field("kernel", description="with metrics: the kernel's name")
    grid: tuple[int, int, int] | None = Field(None, description="with metrics: grid size in blocks")
    block: tuple[int, int, int] | None = Field(None, description="with metrics: block size in threads")
    findings: list[RuleFinding] = Field(default_factory=list, description="with metrics: profiler rule findings")
    max_kernels: int = Field(5, ge=1, le=50, description="heavy kernels to classify (heaviest first)")

    @model_validator(mode="after")
    def _one_source(self) -> Request:
        if (self.profile_id is None) == (self.metrics is None):
            raise ValueError("give exactly one of profile_id (from profile_kernel) or metrics")
        return self


class KernelState(BaseModel):
    """One kernel (or the whole candidate) and the KB state it is in."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="launch index of the kernel (-1: the whole candidate)")
    name: str
    instances: int = Field(1, description="identical launches folded into this entry")
    time_share: float
    duration_us: float
    state_id: str | None = Field(None, description="pass this to suggest_optimizations")
    state_name: str | None = None
    state_origin: str | None = Field(None, description="seed | discovered | imported")
    matched_by: str | None = Field(None, description="signature (existing state) | discovered (created by this call)")
    primary: str | None = None
    secondary: str | None = None
    confidence: float = 0.0
    evidence: list[Evidence] = Field(default_factory=list)
    supporting_findings: list[RuleSupport] = Field(default_factory=list)
    alternatives: list[str] = Field(default_factory=list, description="other causes that also fired")
    note: str = ""


class Result(BaseModel):
    """Heavy kernels heaviest first, the candidate as a whole, and whether the KB grew."""

    model_config = ConfigDict(extra="forbid")

    profile_id: str | None
    counters_available: bool
    kernels: list[KernelState]
    overall: KernelState | None
    basis: str = Field(description="how the whole-candidate state was reached")
    kb_grew: bool
    new_state_ids: list[str] = Field(default_factory=list)
    next_step: str = ""


def _profile_from_metrics(req: Request) -> Profile:
    assert req.metrics is not None
    kernel = KernelProfile(
        index=0, name=req.kernel_name, full_name=req.kernel_name,
        grid=req.grid or (1 << 20, 1, 1),  # unknown grid: assume plenty of blocks rather than invent a cause
        block=req.block or (256, 1, 1),
        metrics=req.metrics, findings=req.findings,
    )
    return Profile(profile_id="p_00000000", problem="(raw metrics)", kernels=[kernel],
                   total_gpu_time_ns=req.metrics.duration_ns or 0.0)


def _state(c: KernelClassification, assigned: dict[str, StateAssignment]) -> KernelState:
    a = assigned.get(c.key) if c.key else None
    return KernelState(
        index=c.index, name=c.name, instances=c.instances, time_share=c.time_share,
        duration_us=round(c.duration_ns / 1e3, 3),
        state_id=a.state.id if a else None, state_name=a.state.name if a else None,
        state_origin=a.state.origin if a else None, matched_by=a.matched_by if a else None,
        primary=c.primary.value if c.primary else None, secondary=c.secondary.value if c.secondary else None,
        confidence=c.confidence, evidence=c.evidence, supporting_findings=c.rules,
        alternatives=c.alternatives, note=_note(c, a),
    )


def _note(c: KernelClassification, a: StateAssignment | None) -> str:
    """The classification's note, and why a signature matching no state added none."""
    if a is not None or c.key is None or not c.missing:
        return c.note
    why = (f"{c.key} matches no KB state, and a new state is not added from incomplete metrics: give "
           f"{', '.join(c.missing)} too (profile_kernel measures them)")
    return f"{c.note}; {why}" if c.note else why


def run(ctx: ToolContext, req: Request, progress: Progress = no_progress) -> Result:
    """Classifies the profile's heavy kernels and the whole candidate, and maps them to KB states."""
    if req.profile_id is not None:
        try:
            prof = ProfileStore(ctx.profiles_dir).load(req.profile_id)
        except ProfileNotFound as exc:
            raise ToolError(str(exc)) from exc
    else:
        prof = _profile_from_metrics(req)
    result = classify_profile(prof, max_kernels=req.max_kernels)
    todo = list(result.kernels) + ([result.overall] if result.overall else [])
    with ctx.store.transaction() as tx:  # one transaction: each new key is discovered once
        assigned = assign_states(tx, [c for c in todo if c.key])
    new_ids = sorted({a.state.id for a in assigned.values() if a.matched_by == "discovered"})
    kernels = [_state(c, assigned) for c in result.kernels]
    overall = _state(result.overall, assigned) if result.overall else None
    target = overall if overall and overall.state_id else (kernels[0] if kernels else None)
    next_step = (
        f"call suggest_optimizations with state_id={target.state_id}" if target and target.state_id
        else "no state could be assigned: profile with counters (profile_kernel on a GPU with Nsight Compute), "
        "or give the metrics each kernel's note names"
    )
    progress(1, 1, "classified")
    return Result(
        profile_id=req.profile_id, counters_available=prof.counters_available, kernels=kernels, overall=overall,
        basis=result.basis, kb_grew=bool(new_ids), new_state_ids=new_ids, next_step=next_step,
    )
