"""Detectors: each looks for one specific cause of a kernel's slowness and returns a Diagnosis
with its evidence when the cause is present (None otherwise)."""

from __future__ import annotations

from collections.abc import Callable

from kb_mcp.harness.profile_model import KernelProfile
from kb_mcp.kb.models import Secondary
from kb_mcp.policy.classify.models import Diagnosis, Evidence
from kb_mcp.policy.classify.signals import (
    Throughput,
    blocks,
    conflict_rate,
    diag,
    given,
    has_counters,
    instructions,
    reaches,
    rule_sector_use,
    rules_for,
    top_stall,
    v,
)
from kb_mcp.policy.classify.thresholds import (
    ATOMIC_SHARE,
    BANK_CONFLICTS_PER_REQ,
    COALESCED_MAX_SPR,
    DEFAULT_SM_COUNT_FALLBACK,
    DIVERGENT_TPI,
    HIGH_PCT,
    MATMUL_FMA_PCT,
    MATMUL_NAME,
    MATMUL_REUSE_HIT_PCT,
    MID_PCT,
    OCCUPANCY_LIMIT_PCT,
    SPILL_SHARE,
    SUSPECT_SPR,
    TENSOR_IDLE_PCT,
)

Detector = Callable[[KernelProfile], "Diagnosis | None"]


def detect_too_few_blocks(k: KernelProfile) -> Diagnosis | None:
    """Fewer blocks than SMs (and no unit busy): most of the GPU idles."""
    m = k.metrics
    if has_counters(m) and reaches(Throughput.of(m).busiest, HIGH_PCT):
        return None
    sms = m.extra.get("device__attribute_multiprocessor_count")
    n_blocks = blocks(k)
    limit = sms if sms else DEFAULT_SM_COUNT_FALLBACK
    if n_blocks >= limit:
        return None
    ev = [Evidence(metric="grid_blocks", value=n_blocks, threshold=limit, relation="<",
                   note=f"{n_blocks} block(s) for {int(limit)} SMs" if sms else f"{n_blocks} block(s): fewer than any "
                                                                                "recent GPU's SM count")]
    if m.waves_per_sm is not None:
        ev.append(Evidence(metric="waves_per_sm", value=m.waves_per_sm, note="fraction of one full wave of blocks"))
    return diag(Secondary.too_few_blocks, 1.0 - n_blocks / limit, ev, k.findings)


def detect_register_spills(k: KernelProfile) -> Diagnosis | None:
    """Local-memory traffic (register spills or local arrays) is a real share of the instructions."""
    m = k.metrics
    inst = instructions(m)
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
    return diag(Secondary.register_spills, share / 0.2, ev, k.findings)


def detect_bank_conflicts(k: KernelProfile) -> Diagnosis | None:
    """Shared-memory instructions replay for bank conflicts, and the shared/L1 pipe is busy or stalling.

    The conflict rate comes from the best source the profile has (`signals.conflict_rate`); a
    profile with neither L1 utilisation nor warp stalls (a details page alone) takes the word of
    ncu's SharedMemoryConflicts rule for the pipe being the problem.
    """
    m = k.metrics
    found = conflict_rate(k)
    if found is None or found[0] < BANK_CONFLICTS_PER_REQ:
        return None
    rate, ev_rate = found
    stall = top_stall(m)
    l1 = m.l1_throughput_pct
    if l1 is not None and l1 >= MID_PCT:
        busy = Evidence(metric="l1_throughput_pct", value=l1, threshold=MID_PCT, relation=">=",
                        note="L1/shared pipe utilisation")
    elif stall is not None and stall[0] in ("mio_throttle", "short_scoreboard"):
        busy = Evidence(metric=f"warp_stalls.{stall[0]}", value=stall[1],
                        note="dominant stall: the shared-memory queue")
    elif l1 is None and stall is None and rules_for(Secondary.bank_conflicts, k.findings):
        busy = Evidence(metric="rule:SharedMemoryConflicts", value=1.0,
                        note="no L1 utilisation or stalls in this profile: ncu's rule says the conflicts cost time")
    else:
        return None
    return diag(Secondary.bank_conflicts, rate / 8.0, [ev_rate, busy], k.findings)


def detect_uncoalesced(k: KernelProfile) -> Diagnosis | None:
    """Global loads (or stores) touch more sectors per request than any coalesced access could.

    Without sector/request counters (a details page alone), ncu's MemoryCacheAccessPattern rule
    stands in: the bytes each thread uses of a 32-byte sector it fetched.
    """
    m = k.metrics
    if not reaches(Throughput.of(m).mem, 20.0):
        return None  # scattered or not, too little traffic to matter (or none measured)
    spr = m.sectors_per_request
    st_req = m.extra.get("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", 0.0)
    st_spr = m.extra.get("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", 0.0) / st_req if st_req else 0.0
    if spr is None and not st_req:
        return _uncoalesced_by_rule(k)
    worst = max(v(spr), st_spr)
    if worst <= SUSPECT_SPR:
        return None
    rules = rules_for(Secondary.uncoalesced_access, k.findings)
    if worst <= COALESCED_MAX_SPR and not rules:
        return None  # 8..16 sectors is what 8- or 16-byte coalesced loads touch: need the profiler's word
    which = "loads" if v(spr) >= st_spr else "stores"
    ev = [Evidence(metric="sectors_per_request" if which == "loads" else "store_sectors_per_request",
                   value=round(worst, 2), threshold=COALESCED_MAX_SPR if worst > COALESCED_MAX_SPR else SUSPECT_SPR,
                   relation=">", note=f"global {which}: 4 is a coalesced 4-byte access, 32 one sector per thread"),
          *_memory(k)]
    return diag(Secondary.uncoalesced_access, (worst - 4.0) / 28.0, ev, k.findings)


def _memory(k: KernelProfile) -> list[Evidence]:
    """The memory side's throughput as measured (DRAM standing in where only it is given), if at all."""
    t = Throughput.of(k.metrics)
    return given(t.mem_metric, t.mem)


def _uncoalesced_by_rule(k: KernelProfile) -> Diagnosis | None:
    found = rule_sector_use(k.findings)
    # A warp's 32 coalesced 4-byte accesses fill 4 sectors; spread over COALESCED_MAX_SPR sectors or
    # more, each thread uses at most 128 / COALESCED_MAX_SPR bytes of every sector it fetches.
    limit = 128.0 / COALESCED_MAX_SPR
    if found is None or found[1] > limit:
        return None
    which, used = found
    ev = [Evidence(metric=f"rule:MemoryCacheAccessPattern.global_{which}_bytes_used_per_sector", value=used,
                   threshold=limit, relation="<=",
                   note=f"ncu's rule: each thread uses {used:g} of the 32 bytes of a sector it fetches "
                        "(no sector/request counters in this profile)"),
          *_memory(k)]
    return diag(Secondary.uncoalesced_access, (128.0 / max(used, 1.0) - 4.0) / 28.0, ev, k.findings)


def detect_atomics(k: KernelProfile) -> Diagnosis | None:
    """Global atomics are a real share of the instructions and nothing else is near its peak."""
    m = k.metrics
    inst = instructions(m)
    if not m.atomic_requests or inst <= 0:
        return None
    share = m.atomic_requests / inst
    atomic_unit = m.extra.get("lts__d_atomic_input_cycles_active.avg.pct_of_peak_sustained_elapsed", 0.0)
    if share < ATOMIC_SHARE:
        return None
    if reaches(Throughput.of(m).busiest, HIGH_PCT) and atomic_unit < HIGH_PCT:
        return None
    ev = [Evidence(metric="atomic_requests_per_inst", value=round(share, 4), threshold=ATOMIC_SHARE, relation=">=",
                   note="global atomic/reduction requests per warp instruction"),
          Evidence(metric="atomic_requests", value=m.atomic_requests)]
    stall = top_stall(m)
    if stall:
        ev.append(Evidence(metric=f"warp_stalls.{stall[0]}", value=stall[1],
                           note="cycles each instruction waits: updates to the same addresses serialize in L2"))
    return diag(Secondary.atomics, share / 0.04, ev, k.findings)


def detect_divergence(k: KernelProfile) -> Diagnosis | None:
    """Warps run with many lanes masked off."""
    m = k.metrics
    tpi = m.threads_per_inst
    if tpi is None or tpi >= DIVERGENT_TPI or instructions(m) < 1e5:
        return None
    ev = [Evidence(metric="threads_per_inst", value=round(tpi, 2), threshold=DIVERGENT_TPI, relation="<",
                   note="active threads per executed instruction; 32 means no divergence")]
    return diag(Secondary.divergence, (DIVERGENT_TPI - tpi) / 16.0, ev, k.findings)


def detect_tensor_cores_idle(k: KernelProfile) -> Diagnosis | None:
    """Matmul-like work (operand reuse, FMA-heavy) with the tensor pipe idle."""
    m = k.metrics
    if m.tensor_pipe_pct is None or m.tensor_pipe_pct >= TENSOR_IDLE_PCT or v(m.fma_pipe_pct) < MATMUL_FMA_PCT:
        return None
    if not reaches(Throughput.of(m).busiest, MID_PCT):
        return None
    named = bool(MATMUL_NAME.search(k.name))
    reuse = v(m.l1_hit_rate_pct) >= MATMUL_REUSE_HIT_PCT and v(m.dram_throughput_pct) < 20.0
    if not (named or reuse):
        return None
    ev = [Evidence(metric="tensor_pipe_pct", value=v(m.tensor_pipe_pct), threshold=TENSOR_IDLE_PCT, relation="<",
                   note="tensor cores idle"),
          Evidence(metric="fma_pipe_pct", value=v(m.fma_pipe_pct), threshold=MATMUL_FMA_PCT, relation=">=",
                   note="the FP32 FMA pipe does the multiply-adds")]
    if reuse:
        ev.append(Evidence(metric="l1_hit_rate_pct", value=v(m.l1_hit_rate_pct), threshold=MATMUL_REUSE_HIT_PCT,
                           relation=">=", note="operands re-read through L1: GEMM-like reuse"))
    if named:
        ev.append(Evidence(metric="kernel_name_matmul_like", value=1.0, note=f"'{k.name}' names a matrix product"))
    return diag(Secondary.tensor_cores_idle, 0.6 + 0.2 * named + 0.2 * reuse, ev, k.findings)


def detect_occupancy_limit(k: KernelProfile) -> Diagnosis | None:
    """Registers or shared memory cap the resident warps, and no unit is near its peak."""
    m = k.metrics
    theo = m.theoretical_occupancy_pct
    if theo is None or theo > OCCUPANCY_LIMIT_PCT or m.occupancy_limiter not in ("registers", "shared_mem"):
        return None
    if reaches(Throughput.of(m).busiest, HIGH_PCT):
        return None
    registers = m.occupancy_limiter == "registers"
    secondary = Secondary.register_occupancy if registers else Secondary.shared_memory_occupancy
    ev = [Evidence(metric="theoretical_occupancy_pct", value=theo, threshold=OCCUPANCY_LIMIT_PCT, relation="<=",
                   note=f"limited by {m.occupancy_limiter.replace('_', ' ')}")]
    if secondary is Secondary.register_occupancy and m.registers_per_thread is not None:
        ev.append(Evidence(metric="registers_per_thread", value=m.registers_per_thread))
    if secondary is Secondary.shared_memory_occupancy and m.shared_mem_per_block_bytes is not None:
        ev.append(Evidence(metric="shared_mem_per_block_bytes", value=m.shared_mem_per_block_bytes))
    stall = top_stall(m)
    if stall:
        ev.append(Evidence(metric=f"warp_stalls.{stall[0]}", value=stall[1],
                           note="dominant stall: too few warps to hide it"))
    return diag(secondary, (OCCUPANCY_LIMIT_PCT - theo) / 40.0, ev, k.findings)


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
