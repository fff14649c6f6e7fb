"""GPU memory as a resource the harness plans (server side: plain pydantic and arithmetic, no torch).

KernelBench problems move up to 16 GB per forward. A verification that kept every input set, every
reference output and every candidate output alive at once (as small problems can afford) needs many
times that, and so did the harness's own comparison temporaries. So before anything of a problem
runs on the GPU, the worker measures its **footprint** on the meta device (one input set, one
output, the parameters, the FLOPs: sizes only, nothing allocated; `harness.worker.footprint`), and
`plan` decides, from the free memory of the device at that moment, how the verification keeps its
data:

* `device`: each input set's pristine copy stays on the GPU beside the candidate's own clone, and
  every check of the set (inputs unchanged, the comparison, the float64 judgment) runs there: the
  plan's first choice, whatever the problem's size, wherever the device holds it;
* `host`: the pristine copy is kept in host memory (one pinned buffer, reused set after set) and
  the candidate gets the set itself (one set fewer on the GPU; comparisons upload it a chunk at a
  time): only where the device cannot hold the second set, or the caller asks for it
  (`VerifyOptions.checks_on`);
* too large: even eager (parameters, one input set and its output) does not fit the free memory, or
  no way of verifying it does. That is the problem's limit on this GPU, said with the numbers, and
  nothing is stored against a candidate.

In every mode input sets are made from their seeds one at a time, checked and freed, and each
process returns its cached blocks after each request; `MemoryReport` says what a verification
planned and what it took (`VerifyResult.memory`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "FIXED_OVERHEAD_BYTES", "GIB", "Footprint", "MemoryPlan", "MemoryReport", "SetPeak",
    "TooLarge", "bound", "fits_eager", "gib", "plan", "reserve",
]

GIB = float(1 << 30)
# Kept free beyond what a plan counts: the candidate's and the reference's intermediates (unknown
# before they run), the allocator's rounding and fragmentation, library workspaces (cuBLAS, cuDNN).
RESERVE_FRACTION = 0.08
RESERVE_MIN_BYTES = 1 << 30
# What a verification may take on the device beyond eager's peak, two of the larger of one input set
# and one output, and (checks on the device) the pristine copy of one input set (`bound`), every
# harness process together, above the device's idle level (where the workers' CUDA contexts are
# counted): the allocators' rounding, library workspaces, torch.compile's own buffers, and the CUDA
# contexts of harness processes started during the request. Measured on an H200 for a 2 GiB-in,
# 2 GiB-out problem: 1.16 GiB (0.38 in the verify worker beyond its tensors, 0.78 in the other
# processes); docs/benchmarks.md, "GPU memory of a verification".
FIXED_OVERHEAD_BYTES = 3 << 29  # 1.5 GiB


def gib(n: float | None) -> float | None:
    """Bytes as GiB, rounded for people (None stays None)."""
    return None if n is None else round(n / GIB, 3)


class Footprint(BaseModel):
    """What one eager forward of a problem holds, measured on the meta device (no memory used)."""

    model_config = ConfigDict(extra="forbid")

    input_bytes: int = Field(0, ge=0, description="one input set (the tensors get_inputs() returns)")
    output_bytes: int = Field(0, ge=0, description="one forward's output tensors")
    param_bytes: int = Field(0, ge=0, description="the Model's parameters and buffers")
    flops: float = Field(0.0, ge=0, description="FLOPs of one forward (torch.utils.flop_counter)")
    dtypes: list[str] = Field(default_factory=list, description="floating dtypes of inputs, outputs and parameters")
    dtype: str = Field("float32", description="the first floating dtype among the inputs, then the outputs: the "
                       "precision the roofline bound is taken at")
    method: Literal["meta", "device"] = Field("meta", description="meta: sizes read on the meta device; device: "
                                              "measured on the GPU (the forward has no meta implementation)")
    eager_peak_bytes: int | None = Field(None, ge=0, description="parameters, one input set and the most one eager "
                                         "forward allocated on top: measured on the GPU in the first check")
    note: str = ""

    @property
    def eager_bytes(self) -> int:
        """What eager needs at least: the measured peak where known, else parameters, inputs and output."""
        least = self.param_bytes + self.input_bytes + self.output_bytes
        return max(least, self.eager_peak_bytes or 0)


class MemoryPlan(BaseModel):
    """How a verification keeps its data on a device with `free_bytes` free (`plan`)."""

    model_config = ConfigDict(extra="forbid")

    pristine: Literal["device", "host"] = Field("device", description=(
        "where each input set's pristine copy is kept, and so where the checks of a set run: device (every "
        "comparison and the float64 judgment on the GPU) or host (the pristine copy in host memory, uploaded a "
        "chunk at a time to be compared)"))
    poison_copies: int = Field(2, ge=1, le=2, description="blocks of the output's size poisoned before each "
                                                         "candidate call")
    needed_bytes: int = Field(0, ge=0, description="what the plan counts on, the reserve included")
    note: str = Field("", description="why the checks run where they do (host: what the device plan needed)")
    free_bytes: int = Field(0, ge=0)
    total_bytes: int = Field(0, ge=0)


class TooLarge(BaseModel):
    """A problem that does not fit this GPU: the problem's limit, never a candidate's fault."""

    model_config = ConfigDict(extra="forbid")

    what: Literal["eager", "verification"] = Field(description="eager: even one eager forward does not fit; "
                                                   "verification: eager fits but no plan of a verification does")
    needed_bytes: int
    free_bytes: int
    total_bytes: int
    footprint: Footprint

    @property
    def text(self) -> str:
        """The refusal, with the numbers."""
        fp = self.footprint
        parts = (f"inputs {gib(fp.input_bytes)} GiB, output {gib(fp.output_bytes)} GiB, parameters "
                 f"{gib(fp.param_bytes)} GiB")
        need = ("one eager forward needs about" if self.what == "eager"
                else "eager fits, but verifying a candidate against it (two models, the reference's output kept "
                     "beside the candidate's) needs about")
        return (f"it is too large for this GPU: {need} {gib(self.needed_bytes)} GiB ({parts}), and the GPU has "
                f"{gib(self.free_bytes)} GiB free of {gib(self.total_bytes)} GiB")


class SetPeak(BaseModel):
    """The verify worker's allocator peaks over the input sets made since the last set boundary
    (`MemoryReport.set_peaks`): what was live at most, and what the allocator reserved at most
    (live plus cached blocks); a gap between the two is the cache's, not a tensor's."""

    model_config = ConfigDict(extra="forbid")

    sets: str = Field(description="the kinds of the sets checked in the interval, in order ('secret+reused_buffers')")
    start_bytes: int = Field(0, description="what was live when the interval began")
    allocated_bytes: int
    reserved_bytes: int


class MemoryReport(BaseModel):
    """What a verification planned and what it took on the GPU (`VerifyResult.memory`)."""

    model_config = ConfigDict(extra="forbid")

    footprint: Footprint
    plan: MemoryPlan
    verify_peak_bytes: int | None = Field(None, description="the most the verify worker's allocator reserved "
                                          "during the request")
    census_peak_bytes: int | None = Field(None, description="the same for the census worker's part")
    device_peak_bytes: int | None = Field(None, description="the device's memory in use at its highest during "
                                          "the request, every process included (sampled; None where unknown)")
    device_idle_bytes: int | None = Field(None, description="the device's memory in use when the request began")
    stage_peak_bytes: dict[str, int] = Field(default_factory=dict, description=(
        "the verify worker's allocator peak (reserved) in each stage that ran, by stage: where the peak is"))
    set_peaks: list[SetPeak] = Field(default_factory=list, description=(
        "within the checks, the peaks from one set boundary to the next: which sets the peak is in"))

    @property
    def peak_gib(self) -> float | None:
        """The verification's peak: the device's where it was sampled, else the workers' together."""
        if self.device_peak_bytes is not None:
            return gib(self.device_peak_bytes)
        parts = [p for p in (self.verify_peak_bytes, self.census_peak_bytes) if p is not None]
        return gib(sum(parts)) if parts else None


def bound(footprint: Footprint, pristine: Literal["device", "host"]) -> int:
    """The most a verification takes on the device above its idle level, every harness process
    together: eager's peak, two of the larger of one input set and one output, the fixed overhead,
    and with the checks on the device (`pristine="device"`) one more input set, its pristine copy."""
    kept = footprint.input_bytes if pristine == "device" else 0
    return footprint.eager_bytes + 2 * max(footprint.input_bytes, footprint.output_bytes) + kept + FIXED_OVERHEAD_BYTES


def reserve(total_bytes: int) -> int:
    """What a plan keeps free on a device of `total_bytes` (see RESERVE_FRACTION)."""
    return max(RESERVE_MIN_BYTES, int(RESERVE_FRACTION * total_bytes))


def fits_eager(footprint: Footprint, free_bytes: int) -> bool:
    """Whether one eager forward fits `free_bytes` (with the least reserve: the baselines need no more)."""
    return footprint.eager_bytes + RESERVE_MIN_BYTES <= free_bytes


def plan(footprint: Footprint, free_bytes: int, total_bytes: int,
         prefer: Literal["auto", "device", "host"] = "auto") -> MemoryPlan | TooLarge:
    """The plan of a verification on a device with `free_bytes` free, or why none fits.

    Counted on the device, besides the reserve: both models' parameters (the reference and the
    candidate hold their own), the reference's output kept alive while the candidate runs, the
    candidate's output and the poisoned blocks of its size, and the input sets: the pristine copy
    and the candidate's clone (`device`), or the set alone (`host`, its pristine copy in host memory).
    The checks run on the device wherever it holds that (`prefer="auto"` or `"device"`); `"host"`
    keeps the pristine copies on the host whatever the device holds (a comparison of the two paths).
    """
    fp = footprint
    eager = fp.eager_bytes
    if not fits_eager(fp, free_bytes):
        return TooLarge(what="eager", needed_bytes=eager, free_bytes=free_bytes, total_bytes=total_bytes, footprint=fp)
    spare = reserve(total_bytes)
    intermediates = max(0, eager - fp.param_bytes - fp.input_bytes - fp.output_bytes)
    common = 2 * fp.param_bytes + intermediates + 2 * fp.output_bytes
    modes = (("device", 2, 2), ("host", 1, 2), ("host", 1, 1))
    note = "the caller asked for the checks on the host" if prefer == "host" else ""
    for pristine, sets, poison in modes if prefer != "host" else modes[1:]:
        # poison: the candidate's output reuses one of the poisoned blocks; the rest stay cached
        need = common + sets * fp.input_bytes + (poison - 1) * fp.output_bytes + spare
        if need <= free_bytes:
            return MemoryPlan(pristine=pristine, poison_copies=poison, needed_bytes=need, free_bytes=free_bytes,
                              total_bytes=total_bytes, note=note)
        if pristine == "device":
            note = (f"checks on the host: with the pristine copies on the device the verification needs "
                    f"{gib(need)} GiB and the GPU has {gib(free_bytes)} GiB free")
    least = common + fp.input_bytes + spare
    return TooLarge(what="verification", needed_bytes=least, free_bytes=free_bytes, total_bytes=total_bytes,
                    footprint=fp)
