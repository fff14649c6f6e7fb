"""Profile records: what `profile_kernel` returns and `classify_state` reads.

Plain pydantic, no torch or CUDA import, so `policy/` and `kb/` can use it on any machine.
The field names of `KernelMetrics` are the canonical metric names that KB state signatures
(`kb.models.MetricRange.metric`) refer to.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.kb.models import utcnow


class KernelMetrics(BaseModel):
    """Key metrics of one kernel instance, in base units; None where the profiler gave nothing."""

    model_config = ConfigDict(extra="forbid")

    duration_ns: float | None = None  # gpu__time_duration.sum
    elapsed_cycles: float | None = None  # gpc__cycles_elapsed.max
    sm_throughput_pct: float | None = None  # sm__throughput.avg.pct_of_peak_sustained_elapsed
    memory_throughput_pct: float | None = None  # gpu__compute_memory_throughput...pct_of_peak
    dram_throughput_pct: float | None = None  # dram__throughput.avg.pct_of_peak_sustained_elapsed
    l1_throughput_pct: float | None = None  # l1tex__throughput.avg.pct_of_peak_sustained_active
    l2_throughput_pct: float | None = None  # lts__throughput.avg.pct_of_peak_sustained_elapsed
    l1_hit_rate_pct: float | None = None  # l1tex__t_sector_hit_rate.pct
    l2_hit_rate_pct: float | None = None  # lts__t_sector_hit_rate.pct
    achieved_occupancy_pct: float | None = None  # sm__warps_active.avg.pct_of_peak_sustained_active
    theoretical_occupancy_pct: float | None = None  # sm__maximum_warps_per_active_cycle_pct
    occupancy_limiter: str | None = None  # registers | shared_mem | warps | blocks
    registers_per_thread: float | None = None
    shared_mem_per_block_bytes: float | None = None  # static + dynamic
    waves_per_sm: float | None = None
    sectors_per_request: float | None = None  # global loads; 4 is ideal for fp32 coalesced
    bank_conflicts: float | None = None  # shared ld+st bank conflicts (count)
    bank_conflicts_per_request: float | None = None
    threads_per_inst: float | None = None  # active threads per executed instruction; 32 = no divergence
    branch_efficiency_pct: float | None = None
    tensor_pipe_pct: float | None = None  # sm__pipe_tensor_op_hmma_cycles_active pct of peak
    fma_pipe_pct: float | None = None
    xu_pipe_pct: float | None = None  # special function unit
    ipc: float | None = None  # executed instructions per active cycle
    local_spill_requests: float | None = None
    atomic_requests: float | None = None
    warp_stalls: dict[str, float] = Field(default_factory=dict)  # reason -> cycles per issued inst
    extra: dict[str, float] = Field(default_factory=dict)  # further raw metrics by raw ncu name (base units)


class RuleFinding(BaseModel):
    """One finding of the profiler's own rule engine."""

    model_config = ConfigDict(extra="forbid")

    rule: str  # e.g. SOLBottleneck, UncoalescedGlobalAccess
    type: str = ""  # OPT | WRN | INF
    section: str = ""
    message: str
    estimated_speedup_pct: float | None = None
    speedup_type: str | None = None  # local | global


class KernelProfile(BaseModel):
    """One kernel instance, in launch order."""

    model_config = ConfigDict(extra="forbid")

    index: int
    name: str  # short (demangled, no arguments)
    full_name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    metrics: KernelMetrics
    findings: list[RuleFinding] = Field(default_factory=list)


class Profile(BaseModel):
    """The stored result of one `profile_kernel` call."""

    model_config = ConfigDict(extra="forbid")

    profile_id: str
    problem: str  # problem name or content hash
    candidate_id: str | None = None  # None when the reference alone was profiled
    device: str = ""
    arch: str = ""  # e.g. sm_90
    counters_available: bool = True
    counters_reason: str | None = None  # why not, when counters were blocked or ncu is absent
    total_gpu_time_ns: float = 0.0
    total_elapsed_cycles: float = 0.0
    kernels: list[KernelProfile] = Field(default_factory=list)
    created_at: datetime = Field(default_factory=utcnow)
    # How it was collected: "ncu" (hardware counters) or "timeline" (per-kernel timings only).
    method: str = "ncu"
    report_file: str | None = None  # the ncu report beside the stored profile, for the Nsight Compute GUI
    imported_from: list[str] = Field(default_factory=list)  # a user's own report files this profile was read from
    notes: list[str] = Field(default_factory=list)  # e.g. kernels left out by a launch cap
    wall_s: float | None = None  # wall time of the profiling run
    phases_s: dict[str, float] = Field(default_factory=dict)  # where the wall time went (driver phases, ncu, export)
    # What the driver and ncu processes tried that the sandbox refuses (the `sandbox_attempt`
    # finding's text, from the server's own record); "" when nothing.
    attempt: str = ""
