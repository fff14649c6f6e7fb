"""Profile metrics -> performance-state signatures, deterministically, with the evidence.

Per kernel, a set of detectors (`detectors`) each looks for one specific cause (spills, bank
conflicts, uncoalesced loads, hot atomics, divergence, matmul work on the FMA pipe, occupancy
limits, too few blocks). A cause fires only when its metric crosses a threshold (`thresholds`);
when several fire, the one with the strongest evidence wins, and the profiler's own rule findings
for that cause (with their estimated speedups) add weight. When no specific cause fires, the
throughput picture decides (`throughput`): which unit is near its peak (DRAM, L1/shared serving
on-chip data, caches missing, FMA/tensor/special-function pipes), both (hybrid), or neither
(latency, by the dominant warp stall).

Every signal is read by `signals`, which falls back in a fixed order when a profile recorded
elsewhere (`ncu --set full`, an imported report, a details page alone) lacks a metric: shared
wavefronts or ncu's SharedMemoryConflicts rule stand in for the per-request conflict ratio, the
HighPipeUtilization rule for missing pipe metrics; shared-memory vs global traffic and the L1 hit
rate are checked before a busy memory side is called a cache miss. Each Evidence names the source
it used.

The candidate as a whole is classified from all kernels, weighted by time (`kernels`): many
launches of tiny kernels are launch overhead, several memory-bound kernels are passes a fusion
would remove, else the time-weighted majority of the kernels' signatures.

Matching signatures to KB states (and discovering new ones) is `assign_states` (`states`),
through the KB's own matching API.
"""

from kb_mcp.policy.classify.detectors import DETECTORS, Detector
from kb_mcp.policy.classify.kernels import classify_kernel, classify_profile
from kb_mcp.policy.classify.models import (
    Diagnosis,
    Evidence,
    KernelClassification,
    ProfileClassification,
    RuleSupport,
)
from kb_mcp.policy.classify.signals import has_counters
from kb_mcp.policy.classify.states import StateAssignment, assign_states
from kb_mcp.policy.classify.throughput import throughput_diagnosis

__all__ = [
    "DETECTORS",
    "Detector",
    "Diagnosis",
    "Evidence",
    "KernelClassification",
    "ProfileClassification",
    "RuleSupport",
    "StateAssignment",
    "assign_states",
    "classify_kernel",
    "classify_profile",
    "has_counters",
    "throughput_diagnosis",
]
