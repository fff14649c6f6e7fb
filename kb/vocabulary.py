"""The shared vocabulary of KB records, the seed KB, the classifier, the harness and the agents: the
bottleneck enums (`Primary` x `Secondary`, a State's signature), the verdicts, the precision tracks and
modes, and the pooled arch key. `kb.models` builds its records on them (and they are importable from there).
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

ALL_ARCH = "*"
"""Arch key of the pooled score over every GPU architecture (fallback when an arch has no data)."""


class Track(str, Enum):
    """The precision track a verdict was checked on, and so the track its speedup counts for.

    `fp32` is strict: the candidate must match the reference in its own precision. The others allow
    TF32 matmuls (`tf32`) or half-precision compute (`bf16`, `fp16`) within that track's tolerances.
    Speedups on different tracks are different quantities, so scores are kept per track.
    """

    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"


DEFAULT_TRACK = Track.fp32
"""The strict track: what every verdict, outcome and score without a track belongs to."""

Mode = Literal["own", "composed"]
"""What a candidate may run besides its own kernels (docs/harness.md, "Composed mode"): `own`, only
its own kernels (PyTorch compute ops and vendor libraries are a `library_call`); `composed`, also
the PyTorch compute ops the reference itself runs, as long as one kernel of its own runs. Verdicts
of the two modes are kept apart in every table; a record without a mode is `own`."""

DEFAULT_MODE: Mode = "own"


class Primary(str, Enum):
    """What limits the kernel first."""

    memory = "memory"
    compute = "compute"
    latency = "latency"
    launch_overhead = "launch_overhead"
    hybrid = "hybrid"  # memory and compute both high: near the roofline ridge
    host = "host"  # host-device transfers or host work dominate the GPU time


class Secondary(str, Enum):
    """Why, one level down. Each value belongs naturally to one primary (see SECONDARY_OF)."""

    # memory
    dram_bandwidth = "dram_bandwidth"
    cache_misses = "cache_misses"
    uncoalesced_access = "uncoalesced_access"
    bank_conflicts = "bank_conflicts"
    atomics = "atomics"
    redundant_passes = "redundant_passes"  # several kernels re-reading what one fused kernel could
    insufficient_bytes_in_flight = "insufficient_bytes_in_flight"
    # compute
    fp32_pipe = "fp32_pipe"
    tensor_cores_idle = "tensor_cores_idle"  # matmul-like work on the FMA pipe
    tensor_cores = "tensor_cores"  # tensor pipe is the busy unit
    special_functions = "special_functions"
    instruction_mix = "instruction_mix"
    divergence = "divergence"
    # latency
    memory_stalls = "memory_stalls"
    register_occupancy = "register_occupancy"
    shared_memory_occupancy = "shared_memory_occupancy"
    too_few_blocks = "too_few_blocks"
    register_spills = "register_spills"
    sync_stalls = "sync_stalls"
    # launch overhead
    many_small_launches = "many_small_launches"
    # hybrid
    balanced_high = "balanced_high"
    balanced_moderate = "balanced_moderate"
    # host
    transfers = "transfers"


SECONDARY_OF: dict[Secondary, Primary] = {
    Secondary.dram_bandwidth: Primary.memory,
    Secondary.cache_misses: Primary.memory,
    Secondary.uncoalesced_access: Primary.memory,
    Secondary.bank_conflicts: Primary.memory,
    Secondary.atomics: Primary.memory,
    Secondary.redundant_passes: Primary.memory,
    Secondary.insufficient_bytes_in_flight: Primary.memory,
    Secondary.fp32_pipe: Primary.compute,
    Secondary.tensor_cores_idle: Primary.compute,
    Secondary.tensor_cores: Primary.compute,
    Secondary.special_functions: Primary.compute,
    Secondary.instruction_mix: Primary.compute,
    Secondary.divergence: Primary.compute,
    Secondary.memory_stalls: Primary.latency,
    Secondary.register_occupancy: Primary.latency,
    Secondary.shared_memory_occupancy: Primary.latency,
    Secondary.too_few_blocks: Primary.latency,
    Secondary.register_spills: Primary.latency,
    Secondary.sync_stalls: Primary.latency,
    Secondary.many_small_launches: Primary.launch_overhead,
    Secondary.balanced_high: Primary.hybrid,
    Secondary.balanced_moderate: Primary.hybrid,
    Secondary.transfers: Primary.host,
}


class Verdict(str, Enum):
    """The harness's judgement of one candidate; only the server's own verdict ever moves a score."""

    faster = "faster"
    slower = "slower"
    incorrect = "incorrect"
    invalid = "invalid"  # an integrity finding (a cheat or a banned call)
    compile_error = "compile_error"
    timeout = "timeout"
    crashed = "crashed"
    needs_gpu = "needs_gpu"  # compiled fine, but verification needs a GPU this machine lacks

    @property
    def is_valid(self) -> bool:
        """Correct and timed: the only verdicts whose speedup means anything."""
        return self in (Verdict.faster, Verdict.slower)
