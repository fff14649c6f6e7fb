"""Profile metrics -> performance-state signatures, deterministically, with the evidence.

Per kernel, a set of detectors each looks for one specific cause (spills, bank conflicts,
uncoalesced loads, hot atomics, divergence, matmul work on the FMA pipe, occupancy limits, too
few blocks). A cause fires only when its metric crosses a threshold; when several fire, the one
with the strongest evidence wins, and the profiler's own rule findings for that cause (with their
estimated speedups) add weight. When no specific cause fires, the throughput picture decides:
which unit is near its peak (DRAM, caches, FMA/tensor/special-function pipes), both (hybrid), or
neither (latency, by the dominant warp stall).

The candidate as a whole is classified from all kernels, weighted by time: many launches of tiny
kernels are launch overhead, several memory-bound kernels are passes a fusion would remove, else
the time-weighted majority of the kernels' signatures.

Thresholds are H100-calibrated (Nsight Compute 2025.3 metric names) but physical in kind: a unit
above ~60 % of peak is the limiter (the cut-over the profiler's own SOL guidance uses); 4 sectors
per request is a coalesced 4-byte load and 16 the most any coalesced load can touch; 32 active
threads per instruction is a warp without divergence.

Matching signatures to KB states (and discovering new ones) is `assign_states`, through the KB's
own matching API.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness.profile_model import KernelMetrics, KernelProfile, Profile, RuleFinding
from kb_mcp.kb import matching
from kb_mcp.kb.models import SECONDARY_OF, Primary, Secondary, Signature, State

if TYPE_CHECKING:
    from kb_mcp.kb.store import KBStore

# --- thresholds ----------------------------------------------------------------------------------

HIGH_PCT = 60.0  # a unit at or above this share of its peak is the limiter
MID_PCT = 40.0  # both units at least this busy, neither at the limit: hybrid, moderately balanced
PIPE_BUSY_PCT = 50.0  # an individual pipe (FMA, tensor, XU) this busy is the compute limiter
SATURATED_PIPE_PCT = 80.0  # a pipe this busy is the limiter even when the memory side is busy too
COALESCED_MAX_SPR = 16.0  # a fully coalesced 16-byte-per-thread load touches 16 sectors; more is scatter
SUSPECT_SPR = 8.0  # above a 4-byte load's 4 sectors: uncoalesced only if the profiler's rule agrees
BANK_CONFLICTS_PER_REQ = 1.0  # extra shared-memory wavefronts per shared instruction (1 = 2-way on average)
DIVERGENT_TPI = 24.0  # active threads per executed instruction (32 = converged warps)
SPILL_SHARE = 0.02  # local-memory requests per executed warp instruction
ATOMIC_SHARE = 0.01  # global atomic/reduction requests per executed warp instruction
OCCUPANCY_LIMIT_PCT = 50.0  # theoretical occupancy at or below this, limited by registers or shared memory
TENSOR_IDLE_PCT = 5.0  # tensor pipe below this while FMA does matmul-like work
MATMUL_FMA_PCT = 15.0
MATMUL_REUSE_HIT_PCT = 85.0  # L1 hit rate of a kernel that re-reads its operands (GEMM-like reuse)
TINY_KERNEL_US = 10.0  # a kernel shorter than this costs about what its launch costs the host
MANY_LAUNCHES = 3
REDUNDANT_KERNELS = 3  # memory-bound kernels that together ...
REDUNDANT_SHARE = 0.5  # ... take at least this share of the GPU time
HEAVY_SHARE = 0.9  # list kernels, heaviest first, until they cover this share of the time
DEFAULT_SM_COUNT_FALLBACK = 16  # without counters: fewer blocks than any recent GPU's SM count
RULE_WEIGHT = 0.5  # score per 100 % of a supporting rule's estimated speedup
MATMUL_NAME = re.compile(r"gemm|matmul|mm_|_mm|bmm|sgemm|hgemm|conv|linear|dot", re.IGNORECASE)

# Profiler rules that speak for each cause (supporting evidence only).
SUPPORTING_RULES: dict[Secondary, tuple[str, ...]] = {
    Secondary.bank_conflicts: ("SharedMemoryConflicts",),
    Secondary.uncoalesced_access: ("UncoalescedGlobalAccess", "MemoryCacheAccessPattern"),
    Secondary.divergence: ("ThreadDivergence",),
    Secondary.register_occupancy: ("TheoreticalOccupancy",),
    Secondary.shared_memory_occupancy: ("TheoreticalOccupancy",),
    Secondary.too_few_blocks: ("LaunchConfiguration",),
    Secondary.register_spills: ("RegisterSpilling",),
    Secondary.memory_stalls: ("CPIStall",),
    Secondary.sync_stalls: ("CPIStall",),
    Secondary.fp32_pipe: ("HighPipeUtilization",),
    Secondary.special_functions: ("HighPipeUtilization",),
    Secondary.tensor_cores: ("HighPipeUtilization",),
    Secondary.tensor_cores_idle: ("MemoryCacheAccessPattern",),
}


# --- result models -------------------------------------------------------------------------------


class Evidence(BaseModel):
    """One metric behind a classification: its value, the threshold it crossed, and what it means."""

    model_config = ConfigDict(extra="forbid")

    metric: str  # canonical KernelMetrics name (or a derived quantity's name)
    value: float
    threshold: float | None = None
    relation: str = ""  # '>=', '<', ... : how value stands to threshold
    note: str = ""


class RuleSupport(BaseModel):
    """A profiler rule finding that agrees with the classification."""

    model_config = ConfigDict(extra="forbid")

    rule: str
    estimated_speedup_pct: float | None = None
    message: str = ""


class Diagnosis(BaseModel):
    """One candidate cause for a kernel's slowness, with how strongly the metrics support it."""

    model_config = ConfigDict(extra="forbid")

    primary: Primary
    secondary: Secondary | None
    strength: float  # 0..1 from the metrics alone
    evidence: list[Evidence] = Field(default_factory=list)
    rules: list[RuleSupport] = Field(default_factory=list)
    specific: bool = True  # a named cause (detector) rather than the throughput fallback

    @property
    def key(self) -> str:
        """'primary/secondary', the KB's signature key."""
        return f"{self.primary.value}/{self.secondary.value if self.secondary else '-'}"

    @property
    def score(self) -> float:
        """Strength plus the weight of the best supporting rule's estimated speedup."""
        best = max((r.estimated_speedup_pct or 0.0 for r in self.rules), default=0.0)
        return self.strength + RULE_WEIGHT * min(best, 100.0) / 100.0


class KernelClassification(BaseModel):
    """The classification of one kernel (or of a group of identical launches)."""

    model_config = ConfigDict(extra="forbid")

    index: int  # launch index of the instance classified (the heaviest of its group)
    name: str
    instances: int = 1  # identical launches (same full name, grid and block) folded into this entry
    duration_ns: float = 0.0  # summed over the instances
    time_share: float = 0.0  # of the profile's GPU time
    primary: Primary | None = None
    secondary: Secondary | None = None
    confidence: float = 0.0
    evidence: list[Evidence] = Field(default_factory=list)
    rules: list[RuleSupport] = Field(default_factory=list)
    alternatives: list[str] = Field(default_factory=list)  # other causes that fired: 'key (score)'
    note: str = ""
    metrics: dict[str, float] = Field(default_factory=dict)  # the metrics to match KB ranges against

    @property
    def key(self) -> str | None:
        """'primary/secondary', or None when nothing could be concluded."""
        if self.primary is None:
            return None
        return f"{self.primary.value}/{self.secondary.value if self.secondary else '-'}"

    def signature(self) -> Signature | None:
        """The observed signature (pair plus point ranges of the metrics), for KB matching."""
        if self.primary is None:
            return None
        return matching.signature_from_metrics(self.primary, self.secondary, self.metrics)


class ProfileClassification(BaseModel):
    """Heavy kernels (heaviest first) and the candidate as a whole."""

    model_config = ConfigDict(extra="forbid")

    kernels: list[KernelClassification] = Field(default_factory=list)
    overall: KernelClassification | None = None
    basis: str = ""  # how `overall` was reached
    counters_available: bool = True


# --- helpers -------------------------------------------------------------------------------------


def _v(value: float | None) -> float:
    return 0.0 if value is None else float(value)


def _rules_for(secondary: Secondary | None, findings: Iterable[RuleFinding]) -> list[RuleSupport]:
    wanted = SUPPORTING_RULES.get(secondary, ()) if secondary else ()
    out = []
    for f in findings:
        if f.rule in wanted:
            out.append(RuleSupport(rule=f.rule, estimated_speedup_pct=f.estimated_speedup_pct, message=f.message[:240]))
    out.sort(key=lambda r: -(r.estimated_speedup_pct or 0.0))
    return out[:2]


def _diag(secondary: Secondary, strength: float, evidence: list[Evidence], findings: Iterable[RuleFinding],
          specific: bool = True) -> Diagnosis:
    return Diagnosis(primary=SECONDARY_OF[secondary], secondary=secondary, strength=max(0.0, min(strength, 1.0)),
                     evidence=evidence, rules=_rules_for(secondary, findings), specific=specific)


def _top_stall(m: KernelMetrics) -> tuple[str, float] | None:
    stalls = {k: v for k, v in m.warp_stalls.items() if k not in ("selected", "not_selected")}
    if not stalls:
        return None
    reason = max(stalls, key=lambda k: stalls[k])
    return reason, stalls[reason]


def _instructions(m: KernelMetrics) -> float:
    return m.extra.get("smsp__inst_executed.sum", 0.0)


def _blocks(k: KernelProfile) -> int:
    return max(k.grid[0], 1) * max(k.grid[1], 1) * max(k.grid[2], 1)


def has_counters(m: KernelMetrics) -> bool:
    """Whether the metrics hold hardware counters (not only a duration from a timeline)."""
    return m.sm_throughput_pct is not None or m.memory_throughput_pct is not None


# --- detectors: each returns a Diagnosis when its cause is present -------------------------------

Detector = Callable[[KernelProfile], "Diagnosis | None"]


def detect_too_few_blocks(k: KernelProfile) -> Diagnosis | None:
    """Fewer blocks than SMs (and no unit busy): most of the GPU idles."""
    m = k.metrics
    if has_counters(m) and max(_v(m.sm_throughput_pct), _v(m.memory_throughput_pct)) >= HIGH_PCT:
        return None
    sms = m.extra.get("device__attribute_multiprocessor_count")
    blocks = _blocks(k)
    limit = sms if sms else DEFAULT_SM_COUNT_FALLBACK
    if blocks >= limit:
        return None
    ev = [Evidence(metric="grid_blocks", value=blocks, threshold=limit, relation="<",
                   note=f"{blocks} block(s) for {int(limit)} SMs" if sms else f"{blocks} block(s): fewer than any recent GPU's SM count")]
    if m.waves_per_sm is not None:
        ev.append(Evidence(metric="waves_per_sm", value=m.waves_per_sm, note="fraction of one full wave of blocks"))
    return _diag(Secondary.too_few_blocks, 1.0 - blocks / limit, ev, k.findings)


def detect_register_spills(k: KernelProfile) -> Diagnosis | None:
    """Local-memory traffic (register spills or local arrays) is a real share of the instructions."""
    m = k.metrics
    inst = _instructions(m)
    if not m.local_spill_requests or inst <= 0:
        return None
    share = m.local_spill_requests / inst
    if share < SPILL_SHARE:
        return None
    ev = [Evidence(metric="local_spill_requests_per_inst", value=round(share, 4), threshold=SPILL_SHARE, relation=">=",
                   note="local-memory loads/stores per warp instruction: registers spilled (or a local array)"),
          Evidence(metric="local_spill_requests", value=m.local_spill_requests)]
    if m.registers_per_thread is not None:
        ev.append(Evidence(metric="registers_per_thread", value=m.registers_per_thread))
    return _diag(Secondary.register_spills, share / 0.2, ev, k.findings)


def detect_bank_conflicts(k: KernelProfile) -> Diagnosis | None:
    """Shared-memory instructions replay for bank conflicts, and the shared/L1 pipe is busy or stalling."""
    m = k.metrics
    per_req = m.bank_conflicts_per_request
    if per_req is None or per_req < BANK_CONFLICTS_PER_REQ:
        return None
    stall = _top_stall(m)
    busy = _v(m.l1_throughput_pct) >= MID_PCT or (stall is not None and stall[0] in ("mio_throttle", "short_scoreboard"))
    if not busy:
        return None
    ev = [Evidence(metric="bank_conflicts_per_request", value=round(per_req, 3), threshold=BANK_CONFLICTS_PER_REQ,
                   relation=">=", note=f"about {per_req + 1:.0f}-way conflicts per shared-memory instruction"),
          Evidence(metric="l1_throughput_pct", value=_v(m.l1_throughput_pct), note="L1/shared pipe utilisation")]
    return _diag(Secondary.bank_conflicts, per_req / 8.0, ev, k.findings)


def detect_uncoalesced(k: KernelProfile) -> Diagnosis | None:
    """Global loads touch more sectors per request than any coalesced access could."""
    m = k.metrics
    spr = m.sectors_per_request
    st_req = m.extra.get("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", 0.0)
    st_spr = m.extra.get("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", 0.0) / st_req if st_req else 0.0
    worst = max(_v(spr), st_spr)
    if worst <= SUSPECT_SPR:
        return None
    if max(_v(m.memory_throughput_pct), _v(m.dram_throughput_pct)) < 20.0:
        return None  # scattered, but too little traffic to matter
    rules = _rules_for(Secondary.uncoalesced_access, k.findings)
    if worst <= COALESCED_MAX_SPR and not rules:
        return None  # 8..16 sectors is what 8- or 16-byte coalesced loads touch: need the profiler's word
    which = "loads" if _v(spr) >= st_spr else "stores"
    ev = [Evidence(metric="sectors_per_request" if which == "loads" else "store_sectors_per_request",
                   value=round(worst, 2), threshold=COALESCED_MAX_SPR if worst > COALESCED_MAX_SPR else SUSPECT_SPR,
                   relation=">", note=f"global {which}: 4 is a coalesced 4-byte access, 32 one sector per thread"),
          Evidence(metric="memory_throughput_pct", value=_v(m.memory_throughput_pct))]
    return _diag(Secondary.uncoalesced_access, (worst - 4.0) / 28.0, ev, k.findings)


def detect_atomics(k: KernelProfile) -> Diagnosis | None:
    """Global atomics are a real share of the instructions and nothing else is near its peak."""
    m = k.metrics
    inst = _instructions(m)
    if not m.atomic_requests or inst <= 0:
        return None
    share = m.atomic_requests / inst
    atomic_unit = m.extra.get("lts__d_atomic_input_cycles_active.avg.pct_of_peak_sustained_elapsed", 0.0)
    if share < ATOMIC_SHARE:
        return None
    if max(_v(m.sm_throughput_pct), _v(m.memory_throughput_pct)) >= HIGH_PCT and atomic_unit < HIGH_PCT:
        return None
    ev = [Evidence(metric="atomic_requests_per_inst", value=round(share, 4), threshold=ATOMIC_SHARE, relation=">=",
                   note="global atomic/reduction requests per warp instruction"),
          Evidence(metric="atomic_requests", value=m.atomic_requests)]
    stall = _top_stall(m)
    if stall:
        ev.append(Evidence(metric=f"warp_stalls.{stall[0]}", value=stall[1],
                           note="cycles each instruction waits: updates to the same addresses serialize in L2"))
    return _diag(Secondary.atomics, share / 0.04, ev, k.findings)


def detect_divergence(k: KernelProfile) -> Diagnosis | None:
    """Warps run with many lanes masked off."""
    m = k.metrics
    tpi = m.threads_per_inst
    if tpi is None or tpi >= DIVERGENT_TPI or _instructions(m) < 1e5:
        return None
    ev = [Evidence(metric="threads_per_inst", value=round(tpi, 2), threshold=DIVERGENT_TPI, relation="<",
                   note="active threads per executed instruction; 32 means no divergence")]
    return _diag(Secondary.divergence, (DIVERGENT_TPI - tpi) / 16.0, ev, k.findings)


def detect_tensor_cores_idle(k: KernelProfile) -> Diagnosis | None:
    """Matmul-like work (operand reuse, FMA-heavy) with the tensor pipe idle."""
    m = k.metrics
    if m.tensor_pipe_pct is None or m.tensor_pipe_pct >= TENSOR_IDLE_PCT or _v(m.fma_pipe_pct) < MATMUL_FMA_PCT:
        return None
    if max(_v(m.sm_throughput_pct), _v(m.memory_throughput_pct)) < MID_PCT:
        return None
    named = bool(MATMUL_NAME.search(k.name))
    reuse = _v(m.l1_hit_rate_pct) >= MATMUL_REUSE_HIT_PCT and _v(m.dram_throughput_pct) < 20.0
    if not (named or reuse):
        return None
    ev = [Evidence(metric="tensor_pipe_pct", value=_v(m.tensor_pipe_pct), threshold=TENSOR_IDLE_PCT, relation="<",
                   note="tensor cores idle"),
          Evidence(metric="fma_pipe_pct", value=_v(m.fma_pipe_pct), threshold=MATMUL_FMA_PCT, relation=">=",
                   note="the FP32 FMA pipe does the multiply-adds")]
    if reuse:
        ev.append(Evidence(metric="l1_hit_rate_pct", value=_v(m.l1_hit_rate_pct), threshold=MATMUL_REUSE_HIT_PCT,
                           relation=">=", note="operands re-read through L1: GEMM-like reuse"))
    if named:
        ev.append(Evidence(metric="kernel_name_matmul_like", value=1.0, note=f"'{k.name}' names a matrix product"))
    return _diag(Secondary.tensor_cores_idle, 0.6 + 0.2 * named + 0.2 * reuse, ev, k.findings)


def detect_occupancy_limit(k: KernelProfile) -> Diagnosis | None:
    """Registers or shared memory cap the resident warps, and no unit is near its peak."""
    m = k.metrics
    theo = m.theoretical_occupancy_pct
    if theo is None or theo > OCCUPANCY_LIMIT_PCT or m.occupancy_limiter not in ("registers", "shared_mem"):
        return None
    if max(_v(m.sm_throughput_pct), _v(m.memory_throughput_pct)) >= HIGH_PCT:
        return None
    secondary = Secondary.register_occupancy if m.occupancy_limiter == "registers" else Secondary.shared_memory_occupancy
    ev = [Evidence(metric="theoretical_occupancy_pct", value=theo, threshold=OCCUPANCY_LIMIT_PCT, relation="<=",
                   note=f"limited by {m.occupancy_limiter.replace('_', ' ')}")]
    if secondary is Secondary.register_occupancy and m.registers_per_thread is not None:
        ev.append(Evidence(metric="registers_per_thread", value=m.registers_per_thread))
    if secondary is Secondary.shared_memory_occupancy and m.shared_mem_per_block_bytes is not None:
        ev.append(Evidence(metric="shared_mem_per_block_bytes", value=m.shared_mem_per_block_bytes))
    stall = _top_stall(m)
    if stall:
        ev.append(Evidence(metric=f"warp_stalls.{stall[0]}", value=stall[1], note="dominant stall: too few warps to hide it"))
    return _diag(secondary, (OCCUPANCY_LIMIT_PCT - theo) / 40.0, ev, k.findings)


DETECTORS: tuple[Detector, ...] = (
    detect_register_spills,
    detect_bank_conflicts,
    detect_uncoalesced,
    detect_atomics,
    detect_divergence,
    detect_tensor_cores_idle,
    detect_occupancy_limit,
    detect_too_few_blocks,
)


def throughput_diagnosis(k: KernelProfile) -> Diagnosis | None:
    """No specific cause: which unit is near its peak, both, or neither (then the dominant stall)."""
    m = k.metrics
    if not has_counters(m):
        return None
    sm, mem, dram = _v(m.sm_throughput_pct), _v(m.memory_throughput_pct), _v(m.dram_throughput_pct)
    ev_sm = Evidence(metric="sm_throughput_pct", value=sm, threshold=HIGH_PCT, relation=">=" if sm >= HIGH_PCT else "<")
    ev_mem = Evidence(metric="memory_throughput_pct", value=mem, threshold=HIGH_PCT,
                      relation=">=" if mem >= HIGH_PCT else "<")
    f = k.findings
    pipes = [(Secondary.tensor_cores, "tensor_pipe_pct", _v(m.tensor_pipe_pct)),
             (Secondary.special_functions, "xu_pipe_pct", _v(m.xu_pipe_pct)),
             (Secondary.fp32_pipe, "fma_pipe_pct", _v(m.fma_pipe_pct))]
    secondary, metric, busiest = max(pipes, key=lambda p: p[2])
    if sm >= HIGH_PCT and busiest >= SATURATED_PIPE_PCT:
        # A saturated pipe limits the kernel; the memory traffic that feeds it (shared-memory operands
        # of a tensor-core GEMM) is not a second, independent limit.
        ev = [ev_sm, Evidence(metric=metric, value=busiest, threshold=SATURATED_PIPE_PCT, relation=">=",
                              note="this pipe is saturated")]
        return _diag(secondary, (busiest - HIGH_PCT) / 40 + 0.5, ev, f, specific=False)
    if sm >= HIGH_PCT and mem >= HIGH_PCT:
        return _diag(Secondary.balanced_high, (min(sm, mem) - HIGH_PCT) / 40 + 0.5, [ev_sm, ev_mem], f, specific=False)
    if mem >= HIGH_PCT and mem >= sm:
        strength = (mem - HIGH_PCT) / 40 + 0.5
        if m.dram_throughput_pct is None:  # only the headline numbers given: DRAM is the usual limiter
            ev = [ev_mem, Evidence(metric="dram_throughput_pct", value=-1.0,
                                   note="not reported: DRAM assumed to be the busy unit")]
            return _diag(Secondary.dram_bandwidth, strength * 0.6, ev, f, specific=False)
        if dram >= HIGH_PCT or dram >= 0.8 * mem:
            ev = [ev_mem, Evidence(metric="dram_throughput_pct", value=dram, threshold=HIGH_PCT, relation=">=",
                                   note="DRAM is the busy unit")]
            return _diag(Secondary.dram_bandwidth, strength, ev, f, specific=False)
        ev = [ev_mem, Evidence(metric="dram_throughput_pct", value=dram, note="DRAM is not the busy unit: L1/L2 are"),
              Evidence(metric="l1_throughput_pct", value=_v(m.l1_throughput_pct)),
              Evidence(metric="l2_throughput_pct", value=_v(m.l2_throughput_pct)),
              Evidence(metric="l1_hit_rate_pct", value=_v(m.l1_hit_rate_pct)),
              Evidence(metric="l2_hit_rate_pct", value=_v(m.l2_hit_rate_pct))]
        return _diag(Secondary.cache_misses, strength, ev, f, specific=False)
    if sm >= HIGH_PCT:
        strength = (sm - HIGH_PCT) / 40 + 0.5
        tensor, xu, fma = _v(m.tensor_pipe_pct), _v(m.xu_pipe_pct), _v(m.fma_pipe_pct)
        if tensor >= PIPE_BUSY_PCT:
            pipe = (Secondary.tensor_cores, "tensor_pipe_pct", tensor)
        elif xu >= PIPE_BUSY_PCT and xu >= fma:
            pipe = (Secondary.special_functions, "xu_pipe_pct", xu)
        elif fma >= PIPE_BUSY_PCT:
            pipe = (Secondary.fp32_pipe, "fma_pipe_pct", fma)
        else:
            ev = [ev_sm, Evidence(metric="fma_pipe_pct", value=fma, threshold=PIPE_BUSY_PCT, relation="<",
                                  note="busy issuing, but not on the FMA, tensor or special-function pipes")]
            return _diag(Secondary.instruction_mix, strength, ev, f, specific=False)
        ev = [ev_sm, Evidence(metric=pipe[1], value=pipe[2], threshold=PIPE_BUSY_PCT, relation=">=")]
        return _diag(pipe[0], strength, ev, f, specific=False)
    if sm >= MID_PCT and mem >= MID_PCT:
        ev = [Evidence(metric="sm_throughput_pct", value=sm, threshold=MID_PCT, relation=">="),
              Evidence(metric="memory_throughput_pct", value=mem, threshold=MID_PCT, relation=">=")]
        return _diag(Secondary.balanced_moderate, 0.5, ev, f, specific=False)
    stall = _top_stall(m)
    if mem >= MID_PCT and stall and stall[0] == "long_scoreboard":
        ev = [Evidence(metric="memory_throughput_pct", value=mem, threshold=MID_PCT, relation=">="),
              Evidence(metric="warp_stalls.long_scoreboard", value=stall[1], note="warps wait on global loads")]
        return _diag(Secondary.insufficient_bytes_in_flight, 0.5, ev, f, specific=False)
    ev = [Evidence(metric="sm_throughput_pct", value=sm, threshold=HIGH_PCT, relation="<"),
          Evidence(metric="memory_throughput_pct", value=mem, threshold=HIGH_PCT, relation="<")]
    if stall is None:
        return Diagnosis(primary=Primary.latency, secondary=None, strength=0.3, evidence=ev, specific=False)
    ev.append(Evidence(metric=f"warp_stalls.{stall[0]}", value=stall[1], note="dominant warp stall (cycles per issued instruction)"))
    if stall[0] in ("long_scoreboard", "lg_throttle", "drain"):
        return _diag(Secondary.memory_stalls, 0.5, ev, f, specific=False)
    if stall[0] in ("barrier", "membar"):
        return _diag(Secondary.sync_stalls, 0.5, ev, f, specific=False)
    # A latency bound with a stall no state names (e.g. instruction fetch, dependency waits).
    return Diagnosis(primary=Primary.latency, secondary=None, strength=0.4, evidence=ev, specific=False)


# --- kernels and profiles ------------------------------------------------------------------------


def _confidence(best: Diagnosis, runner_up: Diagnosis | None) -> float:
    support = max((r.estimated_speedup_pct or 0.0 for r in best.rules), default=0.0)
    conf = 0.5 + 0.35 * best.strength + 0.15 * min(support / 50.0, 1.0)
    if not best.specific:
        conf -= 0.1  # a throughput class says where, not why
    if runner_up is not None and best.score - runner_up.score < 0.15:
        conf *= 0.85  # a close second cause
    return round(max(0.05, min(conf, 0.97)), 3)


def _match_metrics(m: KernelMetrics) -> dict[str, float]:
    data = m.model_dump(exclude={"extra", "occupancy_limiter"}, exclude_none=True)
    return {k: v for k, v in matching.flatten_metrics(data).items()}


def classify_kernel(k: KernelProfile) -> KernelClassification:
    """The signature of one kernel instance with its evidence (primary None if nothing can be said)."""
    found = [d for d in (det(k) for det in DETECTORS) if d is not None]
    fallback = throughput_diagnosis(k)
    ranked = sorted(found, key=lambda d: -d.score) or ([fallback] if fallback else [])
    base = KernelClassification(index=k.index, name=k.name, duration_ns=_v(k.metrics.duration_ns),
                                metrics=_match_metrics(k.metrics))
    if not ranked:
        base.note = ("no hardware counters for this kernel (timings only): its bottleneck cannot be named"
                     if not has_counters(k.metrics) else "no cause could be established from the metrics")
        return base
    best = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    others = [f"{d.key} ({d.score:.2f})" for d in ranked[1:]]
    if fallback is not None and found:
        others.append(f"{fallback.key} (throughput class)")
    base.primary, base.secondary = best.primary, best.secondary
    base.confidence = _confidence(best, runner)
    base.evidence = best.evidence
    base.rules = best.rules
    base.alternatives = others[:3]
    return base


def _group_key(k: KernelProfile) -> tuple[str, tuple[int, int, int], tuple[int, int, int]]:
    return k.full_name, k.grid, k.block


def classify_profile(profile: Profile, max_kernels: int = 5) -> ProfileClassification:
    """Heavy kernels (identical launches folded together, heaviest first) and the whole candidate."""
    kernels = profile.kernels
    total = sum(_v(k.metrics.duration_ns) for k in kernels) or 1.0
    per_instance = {k.index: classify_kernel(k) for k in kernels}

    groups: dict[tuple, list[KernelProfile]] = defaultdict(list)
    for k in kernels:
        groups[_group_key(k)].append(k)
    entries = []
    for members in groups.values():
        heaviest = max(members, key=lambda k: _v(k.metrics.duration_ns))
        entry = per_instance[heaviest.index].model_copy()
        entry.instances = len(members)
        entry.duration_ns = sum(_v(k.metrics.duration_ns) for k in members)
        entry.time_share = round(entry.duration_ns / total, 4)
        entries.append(entry)
    entries.sort(key=lambda e: -e.duration_ns)
    heavy, covered = [], 0.0
    for entry in entries:
        if heavy and (covered >= HEAVY_SHARE or len(heavy) >= max_kernels):
            break
        heavy.append(entry)
        covered += entry.time_share

    overall, basis = _overall(kernels, per_instance, total)
    return ProfileClassification(kernels=heavy, overall=overall, basis=basis,
                                 counters_available=profile.counters_available)


def _overall(kernels: list[KernelProfile], per: dict[int, KernelClassification],
             total: float) -> tuple[KernelClassification | None, str]:
    if not kernels:
        return None, "no kernels ran in the profiled forward"
    durations = [_v(k.metrics.duration_ns) for k in kernels]
    n = len(kernels)
    median_us = statistics.median(durations) / 1e3
    if n >= MANY_LAUNCHES and median_us < TINY_KERNEL_US:
        conf = round(min(0.95, 0.6 + 0.05 * n + 0.2 * (1 - median_us / TINY_KERNEL_US)), 3)
        return KernelClassification(
            index=-1, name="(whole candidate)", instances=n, duration_ns=total, time_share=1.0,
            primary=Primary.launch_overhead, secondary=Secondary.many_small_launches, confidence=conf,
            evidence=[Evidence(metric="kernel_launches", value=n, threshold=MANY_LAUNCHES, relation=">=",
                               note="launches in one forward"),
                      Evidence(metric="median_kernel_duration_us", value=round(median_us, 3), threshold=TINY_KERNEL_US,
                               relation="<", note="each kernel costs about what launching it costs the host")],
            metrics={"duration_ns": statistics.median(durations), "sm_throughput_pct": statistics.median(
                [_v(k.metrics.sm_throughput_pct) for k in kernels])},
        ), "many tiny launches"
    memory_bound = [k for k in kernels if per[k.index].primary is Primary.memory]
    mem_share = sum(_v(k.metrics.duration_ns) for k in memory_bound) / total
    if len(memory_bound) >= REDUNDANT_KERNELS and mem_share >= REDUNDANT_SHARE:
        dram = [_v(k.metrics.dram_throughput_pct) for k in memory_bound]
        sm = [_v(k.metrics.sm_throughput_pct) for k in memory_bound]
        return KernelClassification(
            index=-1, name="(whole candidate)", instances=n, duration_ns=total, time_share=1.0,
            primary=Primary.memory, secondary=Secondary.redundant_passes,
            confidence=round(min(0.95, 0.55 + 0.05 * len(memory_bound) + 0.2 * mem_share), 3),
            evidence=[Evidence(metric="memory_bound_kernels", value=len(memory_bound), threshold=REDUNDANT_KERNELS,
                               relation=">=", note="separate memory-bound passes over the data"),
                      Evidence(metric="memory_bound_time_share", value=round(mem_share, 3),
                               threshold=REDUNDANT_SHARE, relation=">=",
                               note="of the GPU time; one fused kernel would read and write the data once")],
            metrics={"dram_throughput_pct": statistics.mean(dram), "sm_throughput_pct": statistics.mean(sm)},
        ), "several memory-bound kernels"
    weights: dict[str, float] = defaultdict(float)
    best_of: dict[str, KernelClassification] = {}
    for k in kernels:
        c = per[k.index]
        if c.key is None:
            continue
        weights[c.key] += _v(k.metrics.duration_ns)
        if c.key not in best_of or _v(k.metrics.duration_ns) > best_of[c.key].duration_ns:
            best_of[c.key] = c
    if not weights:
        return None, "no kernel could be classified (no hardware counters)"
    key = max(weights, key=lambda key: (weights[key], key))
    share = weights[key] / total
    chosen = best_of[key].model_copy()
    chosen.index, chosen.name, chosen.instances = -1, "(whole candidate)", n
    chosen.duration_ns, chosen.time_share = total, 1.0
    if n > 1:
        chosen.confidence = round(chosen.confidence * (0.5 + 0.5 * share), 3)
        chosen.evidence = [Evidence(metric="time_share", value=round(share, 3),
                                    note=f"share of the GPU time in kernels classified {key}")] + chosen.evidence
    return chosen, ("single kernel" if n == 1 else "time-weighted over kernels")


# --- KB states -----------------------------------------------------------------------------------


class StateAssignment(BaseModel):
    """The KB state a classification maps to."""

    model_config = ConfigDict(extra="forbid")

    key: str
    state: State
    matched_by: str  # 'signature' (same primary/secondary key) | 'discovered' (new state created now)
    distance: float = 0.0  # how far the metrics lie outside the state's ranges (0 = inside)


def assign_states(store: KBStore, classifications: Iterable[KernelClassification]) -> dict[str, StateAssignment]:
    """Maps each distinct signature key to a KB state, creating a discovered state for a key the KB
    lacks (one per key, inheriting its nearest state's optimizations), in one KB transaction."""
    out: dict[str, StateAssignment] = {}
    with store.transaction() as tx:
        for c in classifications:
            sig = c.signature()
            if sig is None or c.key in out:
                continue
            match = matching.match_state(tx, sig, c.metrics)
            if match is not None and match.exact:
                out[sig.key] = StateAssignment(key=sig.key, state=match.state, matched_by="signature",
                                               distance=round(match.distance, 4))
                continue
            state, created = matching.discover_state(tx, sig, metrics=c.metrics)
            out[sig.key] = StateAssignment(key=sig.key, state=state, matched_by="discovered" if created else "signature")
    return out
