"""Precision probes: the numbers that decide whether a kernel computing on the tensor cores in a
precision below its track's still reaches the track's accuracy (pure: the models, the rule and their
wording; the worker runs the probes, `harness.worker.probes`).

The SASS is the trigger, not the verdict (`harness.judgment.precision`): a kernel whose tensor-core
instructions compute in a precision the track does not allow (TF32 in the fp32 track, say) gets
probes. An error-compensated scheme (3xTF32: each operand split into a TF32 high part and a TF32
remainder, three products summed; BF16x9 with three bf16 parts) reaches float32's accuracy on TF32
or bf16 instructions, so the instructions alone cannot tell it from plain TF32; its errors can.

Each probe is one input set (`PROBES`; per floating input tensor, integer ones untouched): the
problem's own distribution, values whose information sits below TF32's mantissa, mixed magnitudes,
and positive values whose partial sums grow along the problem's own reductions. On it the
candidate's output and the strict reference's (the Model in its own dtypes with TF32 off, as the
fp32 track runs it, on every track) are compared with a float64 reference (the Model copied to
float64, inputs upcast). A kernel that passes computes as accurately as the strict reference, which
every track accepts; the bound is not relaxed per track (a bf16 kernel in the tf32 track, about 8x
less accurate than TF32, still fails).

The rule (`error_ratio`, `judged`): per output, the candidate's error is measured twice, as the RMS
and as the largest of |out - ref64|, and divided by the same error of the reference; each reference
error is first raised to a floor of one unit roundoff of the output dtype times the output's scale
(its RMS, its largest magnitude): an output stored in float32 cannot be closer than its rounding,
and a reference that happens to be exact must not make that rounding look infinitely worse. The
probe's ratio is the larger of the two, the worst output's. The kernel passes when the ratio is at
most `PROBE_BOUND` on every probe that ran.

Why 32 (simulated in float64 on a CPU, `tests/harness/test_precision_probes.py`; docs/harness.md,
"Precision probes"): the bound must admit float32 itself summed in another order (the reference's
library picks its own), and honest float32 FMAs in one sequence along K err up to about 21x a
blocked reference's at K = 16384 (the largest error over a few thousand outputs varies from draw to
draw); 3xTF32 and BF16x9 stay within 0.3-1.3x (within 3x at K = 16384 when a truncating
tensor-core adder restarts each K-tile); plain TF32 errs 150-1300x and bf16 900-9000x on every
probe. Failing at `PLAIN_RATIO` or more is named plain (uncompensated) arithmetic; between the
bound and it, partial compensation.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.kb.models import Track

PROBE_BOUND = 32.0
"""A candidate passes when its error is at most this multiple of the strict reference's on every probe."""
PLAIN_RATIO = 100.0
"""A failing ratio at least this large is named plain arithmetic in the lowered precision."""
FLOOR_UNITS = 1.0
"""The reference's error is raised to this many unit roundoffs of the output dtype times the output's scale."""

PROBES: tuple[str, ...] = ("own", "low_bits", "mixed_magnitudes", "same_sign")
ARBITER = "float64_arbiter"
"""The name of the float64 arbitration of a failed input set (`harness.worker.probes.against_float64`):
the same rule as the probes, on the set's own inputs."""
PROBE_WORDS = {
    "own": "the problem's own input distribution",
    "low_bits": "values ±2^e·(1 + k·2^-j), j in 13..20, whose information lies below TF32's 10 mantissa bits",
    "mixed_magnitudes": "the inputs scaled by random powers of two from 2^-8 to 2^8",
    "same_sign": "the inputs made positive, so partial sums grow along every reduction (the problem's own K)",
}
# How a compensated scheme on each precision's tensor cores is usually built (for the verdict's wording).
COMPENSATED = {
    "tf32": "3xTF32 (a TF32 high part and a TF32 remainder per operand, three products)",
    "bf16": "BF16x9 (three bf16 parts per operand)",
    "fp16": "fp16 parts per operand with scaling",
    "fp8": "split fp8 operands with scaling",
    "int8": "an integer emulation such as the Ozaki scheme",
}

Status = Literal["pending", "passed", "failed", "unjudged"]


class ProbeError(BaseModel):
    """One probe's numbers: the candidate's and the strict reference's errors against the float64
    reference (of the worst output), the floor, and their ratio (None: the probe did not run). An
    infinite error (a non-finite output) travels as the string "Infinity", not as JSON null."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    probe: str
    ratio: float | None = None
    candidate_rms: float | None = None
    candidate_max: float | None = None
    reference_rms: float | None = None
    reference_max: float | None = None
    floor_rms: float | None = None
    floor_max: float | None = None
    note: str = ""  # why it did not run, or what was odd (an output the probe could not compare)

    @property
    def ran(self) -> bool:
        return self.ratio is not None


class PrecisionCheck(BaseModel):
    """The precision evidence of one verification: the kernels whose SASS computes on the tensor
    cores in precisions the track does not allow, and what the probes found (`status`: pending
    until they run, which needs a GPU; unjudged when none could run, `note` says why)."""

    model_config = ConfigDict(extra="forbid")

    track: Track
    kernels: dict[str, list[str]] = Field(default_factory=dict)  # kernel symbol -> lowered precisions
    status: Status = "pending"
    bound: float = PROBE_BOUND
    probes: list[ProbeError] = Field(default_factory=list)
    note: str = ""

    @property
    def precisions(self) -> list[str]:
        """The lowered precisions, in the order of `harness.judgment.precision.PRECISIONS`."""
        order = ("tf32", "bf16", "fp16", "fp8", "int8")
        found = {p for ps in self.kernels.values() for p in ps}
        return sorted(found, key=lambda p: order.index(p) if p in order else len(order))

    @property
    def worst(self) -> ProbeError | None:
        """The probe with the largest ratio (None when none ran)."""
        ran = [p for p in self.probes if p.ran]
        return max(ran, key=lambda p: p.ratio or 0.0) if ran else None

    def scheme(self) -> str:
        """What the instructions and the numbers together say the kernel computes with."""
        kinds = "/".join(p.upper() for p in self.precisions)
        worst = self.worst
        if self.status == "passed":
            example = " or ".join(COMPENSATED.get(p, "") for p in self.precisions if p in COMPENSATED)
            ratio = f"worst {_x(worst.ratio)}" if worst is not None and worst.ratio is not None else ""
            return (f"{kinds} tensor-core instructions with an error at the strict reference's level "
                    f"({ratio}, bound {_x(self.bound)}): an error-compensated scheme such as {example}")
        if self.status == "failed" and worst is not None and worst.ratio is not None:
            probe = f"{worst.probe} ({PROBE_WORDS[worst.probe]})" if worst.probe in PROBE_WORDS else worst.probe
            if math.isinf(worst.ratio):
                return (f"{kinds} tensor-core instructions whose output is not finite, or not the reference's shape, "
                        f"on {probe}, where the strict reference's is")
            if worst.ratio >= PLAIN_RATIO:
                return (f"plain {kinds}: its error is {_x(worst.ratio)} the strict reference's on {probe}, as {kinds} "
                        f"without compensation gives (bound {_x(self.bound)})")
            return (f"{kinds} with partial compensation: its error is {_x(worst.ratio)} the strict reference's on "
                    f"{probe}, above the bound of {_x(self.bound)}")
        return f"{kinds} tensor-core instructions"

    def evidence(self) -> str:
        """The probes and their ratios, for a reviewer to check."""
        ran = [f"{p.probe} {_x(p.ratio)}" for p in self.probes if p.ratio is not None]
        skipped = [f"{p.probe} ({p.note})" for p in self.probes if not p.ran]
        text = ("probes (error against a float64 reference / the strict reference's, TF32 off): "
                + (", ".join(ran) if ran else "none ran"))
        return text + (f"; not run: {'; '.join(skipped)}" if skipped else "")

    def pending_note(self) -> str:
        """What a verdict reached without running anything says of these kernels."""
        return (f"the kernels {kernel_list(self.kernels)} compute on the tensor cores in "
                f"{'/'.join(self.precisions)} (their SASS), which the {self.track.value} track accepts only at the "
                "strict reference's accuracy: precision probes on a GPU will judge them")


def kernel_list(kernels: dict[str, list[str]], limit: int = 4) -> str:
    """`k1 (tf32), k2 (bf16) ...`: the first few kernels with their precisions."""
    names = ", ".join(f"{k} ({'/'.join(ps)})" for k, ps in list(kernels.items())[:limit])
    return names + (" ..." if len(kernels) > limit else "")


def _x(value: float | None) -> str:
    if value is None:
        return "?"
    return "inf" if math.isinf(value) else f"{value:.3g}x"


def error_ratio(candidate_rms: float, candidate_max: float, reference_rms: float, reference_max: float,
                floor_rms: float, floor_max: float) -> float:
    """The larger of the candidate's RMS and largest error over the reference's, each reference
    error raised to its floor. A non-finite candidate error is an infinite ratio; 0 / 0 is 0."""
    def over(c: float, r: float, floor: float) -> float:
        if not math.isfinite(c):
            return math.inf
        d = max(r, floor)
        if d <= 0.0:
            return 0.0 if c <= 0.0 else math.inf
        return c / d

    return max(over(candidate_rms, reference_rms, floor_rms), over(candidate_max, reference_max, floor_max))


def judged(check: PrecisionCheck, probes: list[ProbeError], note: str = "") -> PrecisionCheck:
    """`check` with the probes' results and the rule's status: failed when any probe that ran
    exceeds the bound, passed when every one is within it, unjudged when none ran or when the
    float64 copy of the reference computed exactly as the strict reference on every probe (its
    forward fixes the dtype, so the probes measure nothing) and the candidate exceeded the bound."""
    ran = [p for p in probes if p.ran]
    status: Status
    if not ran:
        status, note = "unjudged", note or "no probe could run"
    elif all((p.ratio or 0.0) <= check.bound for p in ran):
        status = "passed"
    elif all(p.reference_rms == 0.0 and p.reference_max == 0.0 for p in ran):
        status = "unjudged"
        note = note or ("the float64 copy of the reference computed exactly what the strict reference did on every "
                        "probe (its forward fixes the dtype), so the probes could not measure precision")
    else:
        status = "failed"
    return check.model_copy(update={"probes": probes, "status": status, "note": note})
