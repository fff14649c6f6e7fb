"""Signals read from one kernel's profile: metrics, derived quantities, and the numbers that ncu's
own rule findings state when a metric is missing from the profile.

A profile recorded outside the project (`ncu --set full`, an imported report, a details page
alone) lacks some of the metrics `profile_kernel` asks for; each signal here falls back, in a fixed
order, to the next-best measurement and says in its Evidence which one it used.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from kb_mcp.harness.profile_model import KernelMetrics, KernelProfile, RuleFinding
from kb_mcp.kb.models import SECONDARY_OF, Secondary
from kb_mcp.policy.classify.models import Diagnosis, Evidence, RuleSupport
from kb_mcp.policy.classify.thresholds import (
    BANK_CONFLICTS_PER_REQ,
    L1_SERVES_HIT_PCT,
    SHARED_TRAFFIC_SHARE,
    SUPPORTING_RULES,
    TENSOR_ACTIVE_PCT,
)

SHARED_WAVEFRONTS = ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
                     "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum")
GLOBAL_SECTORS = ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
                  "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum")
_WAYS = re.compile(r"(\d+(?:\.\d+)?)\s*-\s*way bank conflict", re.IGNORECASE)
_SECTOR_USE = re.compile(r"for global (loads|stores)\b.*?only (\d+(?:\.\d+)?) of the 32 bytes transmitted per sector",
                         re.IGNORECASE | re.DOTALL)
_HIGHEST_PIPE = re.compile(r"([A-Za-z0-9]+) is the highest-utilized pipeline \((\d+(?:\.\d+)?)\s*%\)")
# ncu's pipe names (HighPipeUtilization) -> the compute secondary a busy pipe of that kind means.
RULE_PIPES = {"Tensor": Secondary.tensor_cores, "FMA": Secondary.fp32_pipe, "FMAHeavy": Secondary.fp32_pipe,
              "XU": Secondary.special_functions}


def v(value: float | None) -> float:
    """A metric's value, 0 where the profile has none (for comparisons against thresholds)."""
    return 0.0 if value is None else float(value)


def reaches(value: float | None, threshold: float) -> bool:
    """Whether a metric the profile gives is at or above `threshold`; one it lacks is unknown, so
    it reaches nothing (and, read the other way, is not shown to be below anything either)."""
    return value is not None and value >= threshold


def given(metric: str, value: float | None, threshold: float | None = None, note: str = "") -> list[Evidence]:
    """Evidence of a metric the profile gives (how it stands to `threshold`, if any), none for one it
    lacks: a value no one measured is never shown (as 0 or otherwise)."""
    if value is None:
        return []
    relation = "" if threshold is None else (">=" if value >= threshold else "<")
    return [Evidence(metric=metric, value=float(value), threshold=threshold, relation=relation, note=note)]


HEADLINE = ("sm_throughput_pct", "memory_throughput_pct", "dram_throughput_pct")
"""The utilisations every classification leans on (ncu's Speed Of Light section; `profile_kernel`
records all three). A classification from a kernel lacking any may match a KB state but never adds
one (`missing_headline`)."""


def missing_headline(m: KernelMetrics) -> list[str]:
    """The headline metrics `m` lacks: a classification from it rests partly on assumptions."""
    return [name for name in HEADLINE if getattr(m, name) is None]


def has_counters(m: KernelMetrics) -> bool:
    """Whether the metrics hold hardware counters (not only a duration from a timeline)."""
    return any(getattr(m, name) is not None for name in HEADLINE)


def top_stall(m: KernelMetrics) -> tuple[str, float] | None:
    """The dominant warp stall reason and its cycles per issued instruction."""
    stalls = {k: val for k, val in m.warp_stalls.items() if k not in ("selected", "not_selected")}
    if not stalls:
        return None
    reason = max(stalls, key=lambda k: stalls[k])
    return reason, stalls[reason]


def instructions(m: KernelMetrics) -> float:
    """Executed warp instructions (0 when the profile has no count)."""
    return m.extra.get("smsp__inst_executed.sum", 0.0)


def blocks(k: KernelProfile) -> int:
    """Blocks in the kernel's grid."""
    return max(k.grid[0], 1) * max(k.grid[1], 1) * max(k.grid[2], 1)


def rules_for(secondary: Secondary | None, findings: Iterable[RuleFinding]) -> list[RuleSupport]:
    """The (at most two) profiler findings that speak for `secondary`, largest estimated speedup first."""
    wanted = SUPPORTING_RULES.get(secondary, ()) if secondary else ()
    out = [RuleSupport(rule=f.rule, estimated_speedup_pct=f.estimated_speedup_pct, message=f.message[:240])
           for f in findings if f.rule in wanted]
    out.sort(key=lambda r: -(r.estimated_speedup_pct or 0.0))
    return out[:2]


def diag(secondary: Secondary, strength: float, evidence: list[Evidence], findings: Iterable[RuleFinding],
         specific: bool = True) -> Diagnosis:
    """A Diagnosis for `secondary` with its supporting rule findings attached."""
    return Diagnosis(primary=SECONDARY_OF[secondary], secondary=secondary, strength=max(0.0, min(strength, 1.0)),
                     evidence=evidence, rules=rules_for(secondary, findings), specific=specific)


def _extra_sum(m: KernelMetrics, names: tuple[str, ...]) -> float | None:
    values = [m.extra[n] for n in names if n in m.extra]
    return sum(values) if values else None


# --- shared-memory bank conflicts ----------------------------------------------------------------


def rule_conflict_ways(findings: Iterable[RuleFinding]) -> float | None:
    """The largest 'N-way bank conflict' that ncu's SharedMemoryConflicts rule reports, if it fired."""
    ways = [float(m.group(1)) for f in findings if f.rule == "SharedMemoryConflicts"
            for m in _WAYS.finditer(f.message)]
    return max(ways) if ways else None


def conflict_rate(k: KernelProfile) -> tuple[float, Evidence] | None:
    """Extra shared-memory wavefronts per shared instruction, from the best source the profile has.

    In order: conflicts / shared instructions (what `profile_kernel` collects); conflicts /
    conflict-free wavefronts (`--set full` has no shared instruction counts, but has the
    wavefronts: a wavefront without a conflict is one request's worth); the n-way figure of ncu's
    SharedMemoryConflicts rule (a details page alone); conflicts / all executed instructions, a
    lower bound (every shared instruction is an instruction), which can confirm but never deny.
    The Evidence carries the threshold on its own scale (n-way for the rule's figure).
    """
    m = k.metrics
    conflicts = m.bank_conflicts
    wavefronts = _extra_sum(m, SHARED_WAVEFRONTS)
    inst = instructions(m)
    ways = rule_conflict_ways(k.findings)
    if m.bank_conflicts_per_request is not None:
        rate = m.bank_conflicts_per_request
        return rate, _rate_evidence("bank_conflicts_per_request", rate,
                                    f"about {rate + 1:.0f}-way conflicts per shared-memory instruction")
    if conflicts is not None and wavefronts is not None and wavefronts > conflicts:
        rate = conflicts / (wavefronts - conflicts)
        return rate, _rate_evidence("bank_conflicts_per_wavefront", rate,
                                    f"{conflicts:.3g} conflicts over {wavefronts - conflicts:.3g} conflict-free shared "
                                    f"wavefronts (no shared instruction counts in this profile): about "
                                    f"{rate + 1:.0f}-way")
    if ways is not None:
        return ways - 1.0, Evidence(metric="rule:SharedMemoryConflicts.ways", value=ways,
                                    threshold=BANK_CONFLICTS_PER_REQ + 1.0, relation=">=" if ways >= 2 else "<",
                                    note=f"ncu's SharedMemoryConflicts rule: {ways:g}-way bank conflicts "
                                         "(the per-request counters are not in this profile)")
    if conflicts and inst > 0:
        rate = conflicts / inst
        return rate, _rate_evidence("bank_conflicts_per_instruction", rate,
                                    f"{conflicts:.3g} conflicts over all {inst:.3g} warp instructions: at least "
                                    "this many per shared instruction")
    return None


def _rate_evidence(metric: str, rate: float, note: str) -> Evidence:
    relation = ">=" if rate >= BANK_CONFLICTS_PER_REQ else "<"
    return Evidence(metric=metric, value=round(rate, 3), threshold=BANK_CONFLICTS_PER_REQ, relation=relation, note=note)


def rule_sector_use(findings: Iterable[RuleFinding]) -> tuple[str, float] | None:
    """('loads'|'stores', bytes used per 32-byte sector) of the worst global access ncu's
    MemoryCacheAccessPattern rule reports ('only 4.0 of the 32 bytes transmitted per sector')."""
    found = [(m.group(1).lower(), float(m.group(2))) for f in findings if f.rule == "MemoryCacheAccessPattern"
             for m in _SECTOR_USE.finditer(f.message)]
    return min(found, key=lambda x: x[1]) if found else None


# --- where the memory traffic is -----------------------------------------------------------------


def shared_traffic_share(m: KernelMetrics) -> float | None:
    """Shared-memory wavefronts as a share of L1 data traffic (shared wavefronts + global sectors)."""
    shared = _extra_sum(m, SHARED_WAVEFRONTS)
    global_ = _extra_sum(m, GLOBAL_SECTORS)
    if shared is None or global_ is None or shared + global_ <= 0:
        return None
    return shared / (shared + global_)


def onchip_traffic(m: KernelMetrics) -> list[Evidence] | None:
    """Evidence that a busy memory side is L1 serving data it holds (shared memory, or L1 hits),
    not caches missing: None when that cannot be shown (then DRAM or a cache is the busy unit)."""
    l1, l2 = m.l1_throughput_pct, m.l2_throughput_pct
    if l1 is None or (l2 is not None and l2 > l1):
        return None  # L1 is not (known to be) the busy memory unit
    busy = Evidence(metric="l1_throughput_pct", value=l1, note="L1/shared is the busiest memory unit"
                    + (f" (L2 {l2:g} %)" if l2 is not None else ""))
    share = shared_traffic_share(m)
    if share is not None and share >= SHARED_TRAFFIC_SHARE:
        return [busy, Evidence(metric="shared_traffic_share", value=round(share, 3), threshold=SHARED_TRAFFIC_SHARE,
                               relation=">=", note="shared-memory wavefronts vs global sectors through L1: "
                                                   "shared memory has no misses")]
    if m.l1_hit_rate_pct is not None and m.l1_hit_rate_pct >= L1_SERVES_HIT_PCT:
        return [busy, Evidence(metric="l1_hit_rate_pct", value=m.l1_hit_rate_pct, threshold=L1_SERVES_HIT_PCT,
                               relation=">=", note="L1 serves most sectors itself: reuse works, L1 bandwidth is "
                                                   "what limits")]
    return None


# --- compute pipes -------------------------------------------------------------------------------


def rule_highest_pipe(findings: Iterable[RuleFinding]) -> tuple[str, float] | None:
    """(pipe, % of peak) of ncu's HighPipeUtilization rule: 'Tensor is the highest-utilized pipeline (20.2%)'."""
    for f in findings:
        if f.rule == "HighPipeUtilization":
            match = _HIGHEST_PIPE.search(f.message)
            if match:
                return match.group(1), float(match.group(2))
    return None


def pipe_levels(k: KernelProfile) -> list[tuple[Secondary, str, float]]:
    """(secondary, metric, % of peak) of the tensor, XU and FMA pipes. A profile without pipe
    metrics (a details page alone) gets the one pipe ncu's HighPipeUtilization rule names."""
    m = k.metrics
    pipes = [(Secondary.tensor_cores, "tensor_pipe_pct", m.tensor_pipe_pct),
             (Secondary.special_functions, "xu_pipe_pct", m.xu_pipe_pct),
             (Secondary.fp32_pipe, "fma_pipe_pct", m.fma_pipe_pct)]
    if all(p[2] is None for p in pipes):
        named = rule_highest_pipe(k.findings)
        if named and named[0] in RULE_PIPES:
            return [(RULE_PIPES[named[0]], f"rule:HighPipeUtilization.{named[0]}", named[1])]
    return [(s, name, v(value)) for s, name, value in pipes]


def tensor_activity(k: KernelProfile) -> Evidence | None:
    """Evidence that the kernel computes on tensor cores (WMMA, mma.sync, wgmma), if it does."""
    level = k.metrics.tensor_pipe_pct
    metric = "tensor_pipe_pct"
    if level is None:
        named = rule_highest_pipe(k.findings)
        if named is None or named[0] != "Tensor":
            return None
        metric, level = "rule:HighPipeUtilization.Tensor", named[1]
    if level < TENSOR_ACTIVE_PCT:
        return None
    return Evidence(metric=metric, value=level, threshold=TENSOR_ACTIVE_PCT, relation=">=",
                    note="tensor cores at work (HMMA/GMMA instructions issue)")


@dataclass(frozen=True)
class Throughput:
    """The headline utilisations of one kernel (% of peak), None where the profile lacks them.

    `mem` is ncu's Memory Throughput, the busiest of the memory units (DRAM, L1, L2). Where it is
    missing and DRAM throughput is given, DRAM stands in: the busiest unit is at least that busy.
    `mem_metric` names the metric `mem` came from, so evidence shows what was measured."""

    sm: float | None
    mem: float | None
    dram: float | None
    mem_metric: str = "memory_throughput_pct"

    @classmethod
    def of(cls, m: KernelMetrics) -> Throughput:
        """The kernel's SM, memory and DRAM throughput (% of peak), as given."""
        if m.memory_throughput_pct is None and m.dram_throughput_pct is not None:
            return cls(m.sm_throughput_pct, m.dram_throughput_pct, m.dram_throughput_pct, "dram_throughput_pct")
        return cls(m.sm_throughput_pct, m.memory_throughput_pct, m.dram_throughput_pct)

    @property
    def busiest(self) -> float | None:
        """The busier of the SM and memory sides, of those given (None: neither is)."""
        known = [x for x in (self.sm, self.mem) if x is not None]
        return max(known) if known else None
