"""The classifier's thresholds, each with the physical reason for its value.

H100-calibrated (Nsight Compute 2025.3 metric names) but physical in kind: a unit above ~60 % of
peak is the limiter (the cut-over the profiler's own SOL guidance uses); 4 sectors per request is a
coalesced 4-byte load and 16 the most any coalesced load can touch; 32 active threads per
instruction is a warp without divergence.
"""

from __future__ import annotations

import re

from kb_mcp.kb.models import Secondary

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
TENSOR_ACTIVE_PCT = 10.0  # tensor pipe at least this busy: the kernel computes on tensor cores (WMMA/HMMA/GMMA)
MATMUL_FMA_PCT = 15.0
MATMUL_REUSE_HIT_PCT = 85.0  # L1 hit rate of a kernel that re-reads its operands (GEMM-like reuse)
# A memory-bound kernel whose L1 serves most of what it is asked for is not missing its caches:
# above this hit rate the sectors come from L1, and the L1 bandwidth (not DRAM or L2) is the limit.
L1_SERVES_HIT_PCT = 60.0
# Shared-memory wavefronts at least this share of the L1 data traffic (shared wavefronts + global
# sectors): the busy L1 is busy with shared memory, which has no misses at all.
SHARED_TRAFFIC_SHARE = 0.5
TINY_KERNEL_US = 10.0  # a kernel shorter than this costs about what its launch costs the host
MANY_LAUNCHES = 3
REDUNDANT_KERNELS = 3  # memory-bound kernels that together ...
REDUNDANT_SHARE = 0.5  # ... take at least this share of the GPU time
HEAVY_SHARE = 0.9  # list kernels, heaviest first, until they cover this share of the time
DEFAULT_SM_COUNT_FALLBACK = 16  # without counters: fewer blocks than any recent GPU's SM count
RULE_WEIGHT = 0.5  # score per 100 % of a supporting rule's estimated speedup
MATMUL_NAME = re.compile(r"gemm|matmul|mm_|_mm|bmm|sgemm|hgemm|conv|linear|dot", re.IGNORECASE)

# Profiler rules that speak for each cause (supporting evidence; a few also carry numbers that stand
# in for a missing metric, see `signals`).
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
