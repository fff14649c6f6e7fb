"""The throughput class of a kernel no specific detector explains: which unit is near its peak,
both, or neither (then the dominant warp stall decides).

The steps run in a fixed order and the first that applies decides: a saturated pipe; memory and
SM both at their limit; the memory side at its limit (DRAM, on-chip traffic, or caches missing);
the SM side at its limit (which pipe); both moderately busy; else latency.
"""

from __future__ import annotations

from collections.abc import Callable

from kb_mcp.harness.profile_model import KernelProfile
from kb_mcp.kb.models import Primary, Secondary
from kb_mcp.policy.classify.models import Diagnosis, Evidence
from kb_mcp.policy.classify.signals import (
    Throughput,
    diag,
    given,
    has_counters,
    onchip_traffic,
    pipe_levels,
    reaches,
    tensor_activity,
    top_stall,
)
from kb_mcp.policy.classify.thresholds import (
    HIGH_PCT,
    L1_SERVES_HIT_PCT,
    MID_PCT,
    PIPE_BUSY_PCT,
    SATURATED_PIPE_PCT,
)

Step = Callable[[KernelProfile, Throughput], "Diagnosis | None"]


def _sm(t: Throughput, threshold: float = HIGH_PCT) -> list[Evidence]:
    return given("sm_throughput_pct", t.sm, threshold)


def _mem(t: Throughput, threshold: float = HIGH_PCT) -> list[Evidence]:
    note = "" if t.mem_metric == "memory_throughput_pct" else "no memory_throughput_pct given: DRAM stands in for it"
    return given(t.mem_metric, t.mem, threshold, note)


def _strength(level: float) -> float:
    return (level - HIGH_PCT) / 40 + 0.5


def saturated_pipe(k: KernelProfile, t: Throughput) -> Diagnosis | None:
    """A saturated pipe limits the kernel; the memory traffic that feeds it (shared-memory operands
    of a tensor-core GEMM) is not a second, independent limit."""
    secondary, metric, busiest = max(pipe_levels(k), key=lambda p: p[2])
    if not reaches(t.sm, HIGH_PCT) or busiest < SATURATED_PIPE_PCT:
        return None
    ev = [*_sm(t), Evidence(metric=metric, value=busiest, threshold=SATURATED_PIPE_PCT,
                                                   relation=">=", note="this pipe is saturated")]
    return diag(secondary, (busiest - HIGH_PCT) / 40 + 0.5, ev, k.findings, specific=False)


def balanced_high(k: KernelProfile, t: Throughput) -> Diagnosis | None:
    """Memory and SM both at their limit: near the roofline ridge."""
    if t.sm is None or t.mem is None or not reaches(min(t.sm, t.mem), HIGH_PCT):
        return None
    return diag(Secondary.balanced_high, _strength(min(t.sm, t.mem)), [*_sm(t), *_mem(t)], k.findings,
                specific=False)


def memory_limited(k: KernelProfile, t: Throughput) -> Diagnosis | None:
    """The memory side at its limit: DRAM; else L1 serving on-chip data (shared memory or L1 hits,
    feeding tensor cores or not); else caches missing. A profile without a DRAM figure assumes DRAM
    only when the on-chip traffic does not explain the load."""
    m = k.metrics
    if t.mem is None or t.mem < HIGH_PCT or (t.sm is not None and t.mem < t.sm):
        return None
    ev_mem = _mem(t)
    strength = _strength(t.mem)
    f = k.findings
    if t.dram is not None and (t.dram >= HIGH_PCT or t.dram >= 0.8 * t.mem):
        ev = ev_mem if t.mem_metric == "dram_throughput_pct" else [*ev_mem, *given("dram_throughput_pct", t.dram,
                                                                                    HIGH_PCT)]
        ev[-1].note = "; ".join(x for x in (ev[-1].note, "DRAM is the busy unit") if x)
        return diag(Secondary.dram_bandwidth, strength, ev, f, specific=False)
    onchip = onchip_traffic(m)
    if onchip is not None:
        return _onchip_limited(k, ev_mem, onchip, strength)
    if t.dram is None:  # only the headline numbers given: DRAM is the usual limiter
        ev_mem[-1].note = "no dram_throughput_pct given: DRAM assumed to be the busy unit"
        return diag(Secondary.dram_bandwidth, strength * 0.6, ev_mem, f, specific=False)
    ev = [*ev_mem, *given("dram_throughput_pct", t.dram, note="DRAM is not the busy unit: L1/L2 are")]
    if m.l1_hit_rate_pct is not None and m.l1_hit_rate_pct < L1_SERVES_HIT_PCT:
        ev.append(Evidence(metric="l1_hit_rate_pct", value=m.l1_hit_rate_pct, threshold=L1_SERVES_HIT_PCT,
                           relation="<",
                           note="L1 misses most sectors (and no shared-memory traffic explains the load)"))
    elif m.l1_hit_rate_pct is not None:
        ev.append(Evidence(metric="l1_hit_rate_pct", value=m.l1_hit_rate_pct,
                           note="L1 hits, but L2 is the busier unit: the traffic L1 does not hold goes to L2"))
    ev += [*given("l1_throughput_pct", m.l1_throughput_pct), *given("l2_throughput_pct", m.l2_throughput_pct),
           *given("l2_hit_rate_pct", m.l2_hit_rate_pct)]
    return diag(Secondary.cache_misses, strength, ev, f, specific=False)


def _onchip_limited(k: KernelProfile, ev_mem: list[Evidence], onchip: list[Evidence], strength: float) -> Diagnosis:
    """L1 busy with data it holds: operands for tensor cores, or loads per math op (instruction mix)."""
    tensor = tensor_activity(k)
    if tensor is not None:
        tensor.note = "tensor cores at work: the on-chip traffic feeds them"
        return diag(Secondary.tensor_cores, strength * 0.8, [*ev_mem, *onchip, tensor], k.findings, specific=False)
    fma = given("fma_pipe_pct", k.metrics.fma_pipe_pct,
                note="loads and stores served on chip fill the memory pipe: too few math operations per load")
    return diag(Secondary.instruction_mix, strength * 0.7, [*ev_mem, *onchip, *fma], k.findings, specific=False)


def compute_limited(k: KernelProfile, t: Throughput) -> Diagnosis | None:
    """The SM side at its limit: the busiest pipe, or the issue slots (instruction mix)."""
    if t.sm is None or t.sm < HIGH_PCT:
        return None
    levels = {s: (metric, level) for s, metric, level in pipe_levels(k)}
    ev_sm = _sm(t)
    for secondary in (Secondary.tensor_cores, Secondary.special_functions, Secondary.fp32_pipe):
        metric, level = levels.get(secondary, ("", 0.0))
        if level < PIPE_BUSY_PCT:
            continue
        if secondary is Secondary.special_functions and level < levels.get(Secondary.fp32_pipe, ("", 0.0))[1]:
            continue  # FMA busier still: fp32 pipe below
        ev = [*ev_sm, Evidence(metric=metric, value=level, threshold=PIPE_BUSY_PCT, relation=">=")]
        return diag(secondary, _strength(t.sm), ev, k.findings, specific=False)
    fma_metric, fma = levels.get(Secondary.fp32_pipe, ("fma_pipe_pct", 0.0))
    shown = k.metrics.fma_pipe_pct if fma_metric == "fma_pipe_pct" else fma  # a pipe level given, or a rule's
    ev = [*ev_sm, *given(fma_metric, shown, PIPE_BUSY_PCT,
                         note="busy issuing, but not on the FMA, tensor or special-function pipes")]
    return diag(Secondary.instruction_mix, _strength(t.sm), ev, k.findings, specific=False)


def balanced_moderate(k: KernelProfile, t: Throughput) -> Diagnosis | None:
    """Both sides moderately busy, neither at its limit."""
    if t.sm is None or t.mem is None or not reaches(min(t.sm, t.mem), MID_PCT):
        return None
    return diag(Secondary.balanced_moderate, 0.5, [*_sm(t, MID_PCT), *_mem(t, MID_PCT)], k.findings, specific=False)


def latency_bound(k: KernelProfile, t: Throughput) -> Diagnosis:
    """Neither side busy: the dominant warp stall names what the warps wait for."""
    f = k.findings
    stall = top_stall(k.metrics)
    if reaches(t.mem, MID_PCT) and stall and stall[0] == "long_scoreboard":
        ev = [*_mem(t, MID_PCT),
              Evidence(metric="warp_stalls.long_scoreboard", value=stall[1], note="warps wait on global loads")]
        return diag(Secondary.insufficient_bytes_in_flight, 0.5, ev, f, specific=False)
    ev = [*_sm(t), *_mem(t)]
    if stall is None:
        return Diagnosis(primary=Primary.latency, secondary=None, strength=0.3, evidence=ev, specific=False)
    ev.append(Evidence(metric=f"warp_stalls.{stall[0]}", value=stall[1],
                       note="dominant warp stall (cycles per issued instruction)"))
    if stall[0] in ("long_scoreboard", "lg_throttle", "drain"):
        return diag(Secondary.memory_stalls, 0.5, ev, f, specific=False)
    if stall[0] in ("barrier", "membar"):
        return diag(Secondary.sync_stalls, 0.5, ev, f, specific=False)
    # A latency bound with a stall no state names (e.g. instruction fetch, dependency waits).
    return Diagnosis(primary=Primary.latency, secondary=None, strength=0.4, evidence=ev, specific=False)


STEPS: tuple[Step, ...] = (saturated_pipe, balanced_high, memory_limited, compute_limited, balanced_moderate)


def throughput_diagnosis(k: KernelProfile) -> Diagnosis | None:
    """The throughput class of the kernel (None without hardware counters)."""
    if not has_counters(k.metrics):
        return None
    t = Throughput.of(k.metrics)
    for step in STEPS:
        found = step(k, t)
        if found is not None:
            return found
    return latency_bound(k, t)
