"""What the stages of a verification record, before anything is judged: the integrity findings (one
code per exploit class; the codes are listed, with the exploit each names, in docs/architecture.md),
the build's result, each input set's check and the timings. `harness.judgment.verdict` judges them.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FindingCode(str, Enum):
    """One code per exploit class the harness defends against."""

    reused_reference_output = "reused_reference_output"
    uninitialized_output = "uninitialized_output"
    constant_output = "constant_output"
    distribution_shortcut = "distribution_shortcut"
    ignores_inputs = "ignores_inputs"
    input_mutated = "input_mutated"
    library_call = "library_call"
    reference_fallback = "reference_fallback"
    result_caching = "result_caching"
    deferred_work = "deferred_work"
    seed_prediction = "seed_prediction"
    unsynchronized_work = "unsynchronized_work"
    background_thread = "background_thread"
    wrong_output_type = "wrong_output_type"
    harness_tampering = "harness_tampering"
    forged_result = "forged_result"
    precision_lowered = "precision_lowered"
    l2_persistence = "l2_persistence"
    timed_output_mismatch = "timed_output_mismatch"
    stateful_forward = "stateful_forward"
    no_custom_kernel = "no_custom_kernel"
    implausible_speedup = "implausible_speedup"
    impossible_time = "impossible_time"
    # Settings and machinery that speed up library ops without a kernel of the candidate's own
    # (findings of their own, in either mode; docs/harness.md, "Composed mode"):
    tf32_switch = "tf32_switch"  # a global TF32 switch (matmul or cuDNN) turned on by the candidate
    cudnn_benchmark = "cudnn_benchmark"  # cuDNN's benchmark mode (autotuned convolutions) turned on
    graph_replay = "graph_replay"  # library or PyTorch kernels replayed from a CUDA graph
    sandbox_attempt = "sandbox_attempt"


# Findings that describe wrong answers rather than cheating: the verdict is `incorrect`, not `invalid`.
INCORRECT_ONLY = frozenset({FindingCode.constant_output, FindingCode.precision_lowered})
# Findings that hold a result for review without rejecting it.
REVIEW_ONLY = frozenset({FindingCode.implausible_speedup, FindingCode.sandbox_attempt})
# Findings a lowered precision explains: its error grows with the inputs' magnitude, so an honest
# bf16 kernel passes the usual inputs and fails the stretched ones. Beside `precision_lowered` such a
# finding is that precision's wrong answer (`incorrect`), not a cheat on the distribution.
EXPLAINED_BY_PRECISION = frozenset({FindingCode.distribution_shortcut})


class Finding(BaseModel):
    """One integrity finding: what was seen, where, and how sure we are."""

    model_config = ConfigDict(extra="forbid")

    code: FindingCode
    message: str  # actionable: what the candidate did and what to change
    source: str = "runtime"  # static | runtime | timing | sandbox
    line: int | None = None  # for static findings




class CompileUnit(BaseModel):
    """One piece of CUDA source the candidate builds: an NVRTC kernel or a load_inline extension."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["nvrtc", "load_inline"]
    name: str  # kernel name (NVRTC) or extension name (load_inline)
    ok: bool = True
    seconds: float = 0.0
    cached: bool = False
    kernels: list[str] = Field(default_factory=list)  # __global__ function names defined in it
    log: str = ""  # compiler output (truncated)
    # Kernel symbol -> lowered precisions its SASS computes in (`harness.judgment.precision`); None: not read.
    precisions: dict[str, list[str]] | None = None
    # Compile-only: why it could not be compiled fully on this machine (a header torch or the toolkit
    # lacks here, `toolchain.machine_limit`); no error of the candidate's was found, so `ok` holds.
    limited: str = ""


class CompileResult(BaseModel):
    """How the candidate built: which style, how long, and what the compilers said."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    style: Literal["nvrtc", "load_inline", "mixed", "none"] = "none"
    arch: str = ""
    seconds: float = 0.0
    cached: bool = False  # every build unit came from the cache
    units: list[CompileUnit] = Field(default_factory=list)
    messages: list[str] = Field(default_factory=list)  # errors (and first warnings), one line each

    @property
    def kernels(self) -> list[str]:
        """Every kernel name the candidate's sources define."""
        return [k for u in self.units for k in u.kernels]


class InputSetCheck(BaseModel):
    """The candidate against the reference on one input set."""

    model_config = ConfigDict(extra="forbid")

    index: int
    kind: Literal["public_seed", "secret", "shifted", "user_seed", "perturbed", "repeat", "reused_buffers",
                  "second_shape"]
    passed: bool
    skipped: bool = False  # the check could not run (the message says why); it counts as neither pass nor fail
    max_abs_err: float | None = None
    max_rel_err: float | None = None  # over elements with |ref| above 1e-3 of the output's RMS
    scaled_err: float | None = None  # max |c - r| / RMS(r): comparable across problems
    mismatched: int = 0  # elements outside the tolerance (NaN/Inf included)
    numel: int = 0
    message: str = ""
    # Outside the tolerance by a rounding-sized margin: the candidate's error against a float64 copy of
    # the reference over the float32 reference's own (the precision probes' rule); at most its bound passes.
    float64_ratio: float | None = None


class Timings(BaseModel):
    """Medians of CUDA-event-timed runs (L2 flushed before each, fresh inputs each run): the
    end-to-end times the verdict is decided on. Beside them the device times (`kernels.DeviceTime`:
    the GPU durations of the kernels one forward launched, summed; measured under the profiler in
    the census worker), which do not move with the host process as end-to-end launch-bound times do.
    """

    model_config = ConfigDict(extra="forbid")

    candidate_ms: float
    candidate_min_ms: float
    candidate_host_ms: float  # host clock around the same runs (device-wide sync): the cross-check
    runs: int
    eager_ms: float | None = None
    compile_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    speedup_vs_baseline: float | None = None  # over the better of eager and torch.compile
    baseline_cached: bool = False
    baseline_not_cached: str = ""  # why a baseline measured in this run was not cached (not measured alone)
    quick: bool = False  # timing=False: a few runs only
    bound_ms: float | None = None  # the reference's roofline (its FLOPs at peak, I/O through DRAM); None if unknown
    work_bound_ms: float | None = None  # the candidate's own measured work at peak (`harness.plausibility`)
    evidence: list[str] = Field(default_factory=list)  # what an escalated result was checked with, and found
    note: str = ""
    # Launch-bound references are re-timed beside the candidate (docs/harness.md, Timing):
    launch_bound: bool = False  # eager's host issue time is at least half its event time
    eager_retimed: bool = False  # eager_ms is from runs interleaved with this candidate's, not the cache
    eager_cached_ms: float | None = None  # the cached eager figure, where eager was re-timed beside the candidate
    eager_drift: float | None = None  # re-timed / cached eager (above 1: the host is slower now than when cached)
    compile_scaled: bool = False  # compile_ms is the cached figure times eager_drift (see note)
    # Device times (docs/harness.md, "Device time"); None where unknown (the note says why):
    candidate_device_ms: float | None = None
    candidate_kernels: int | None = None  # kernels, copies and sets one forward of the candidate launched
    eager_device_ms: float | None = None
    speedup_device_vs_eager: float | None = None  # eager_device_ms / candidate_device_ms

    @property
    def device_summary(self) -> str:
        """The device times in a few words ("" when the candidate's is unknown)."""
        if self.candidate_device_ms is None:
            return ""
        text = f"device {self.candidate_device_ms:.4g} ms"
        if self.eager_device_ms is not None and self.speedup_device_vs_eager is not None:
            text += f" vs eager {self.eager_device_ms:.4g} ms ({self.speedup_device_vs_eager:.2f}x)"
        return text
