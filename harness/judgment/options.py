"""What a caller asks of one verification (`VerifyOptions`, each track's tolerance floor) and what
those options let the verdict claim (`assess_options`: the options kept in its key, its strength,
what was loosened; docs/architecture.md, "Verdict keys"). The verdict itself is decided in
`harness.judgment.verdict`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from kb_mcp.kb.models import DEFAULT_MODE, DEFAULT_TRACK, Mode, Strength, Track

__all__ = ["TRACK_TOLERANCE", "Effect", "OptionsAssessment", "VerifyOptions", "assess_options"]


# The tolerance floor of each track, (atol in units of the reference output's RMS, rtol): the strict
# fp32 track keeps the dtype's own (`harness.worker.values.DEFAULT_TOLERANCES`: 1e-4 for float32);
# the low-precision tracks check at about 1e-2, KernelBench's original rule (`atol=rtol=1e-02` in
# its eval's `torch.allclose`), the bar TF32/bf16/fp16 results are published against (docs/harness.md).
TRACK_TOLERANCE: dict[Track, tuple[float, float] | None] = {
    Track.fp32: None,
    Track.tf32: (1e-2, 1e-2),
    Track.bf16: (1e-2, 1e-2),
    Track.fp16: (1e-2, 1e-2),
}


class VerifyOptions(BaseModel):
    """How to check one candidate. Defaults are the strict ones; every loosening is visible in the result.

    Tolerances: a value `c` passes against the reference `r` when `|c - r| <= atol * scale + rtol * |r|`,
    where `scale` is the RMS of the reference output (so `atol` means the same for outputs of any size).
    Unset, they come from the problem file's module-level `ATOL` / `RTOL` constants, else from the
    output dtype (see `harness.worker.values.DEFAULT_TOLERANCES`), raised to the track's floor
    (`TRACK_TOLERANCE`). A tolerance looser than that holds the result for review (`flagged`).
    """

    model_config = ConfigDict(extra="forbid")

    track: Track = Field(
        DEFAULT_TRACK,
        description="precision track: fp32 (strict, default), tf32, bf16 or fp16; each has its own tolerance and "
        "its own scores (another track is not a loosening)",
    )

    mode: Mode = Field(
        DEFAULT_MODE,
        description="own: only the candidate's own kernels compute (default); composed: it may also keep the PyTorch "
                    "compute ops the reference itself runs, as long as one kernel of its own runs (for models; "
                    "verdicts of the two modes are kept apart, neither is a loosening)",
    )

    input_sets: int = Field(5, ge=5, le=32,
                            description="input sets from secret seeds (at least 5), plus one of a different "
                                        "distribution")
    seeds: list[int] = Field(
        default_factory=list,
        max_length=8,
        description="extra fixed seeds to check as well (to reproduce a failure); the secret seeds always run",
    )
    atol: float | None = Field(None, ge=0, description="absolute tolerance, in units of the reference output's RMS")
    rtol: float | None = Field(None, ge=0, description="relative tolerance")
    timing: bool = Field(True, description="full timing (many runs); False times a few runs only, for a quick answer")
    timed_runs: int | None = Field(None, ge=5, le=1000,
                                   description="timed runs (default: as many as fit ~0.4 s, 10 to 100)")
    warmup_runs: int = Field(3, ge=1, le=100)
    compile_baseline: bool = Field(
        True,
        description="time torch.compile of the reference besides eager (cached per problem, GPU and torch version)"
    )
    allow: list[str] = Field(
        default_factory=list,
        description="allow-list of library ops the candidate may call: groups `gemm` (cuBLAS), `conv` (cuDNN) or op "
                    "names",
    )
    implausible_speedup: float = Field(
        50.0, gt=1.0,
        description="speedups above this factor are checked further (more input sets, perturbed weights, a second "
                    "shape, the candidate's own work against the device's peaks) before they count",
    )
    timeout_s: float = Field(120.0, gt=0, le=3600,
                             description="limit for each run phase of the candidate (timing, and each input set of the "
                                         "checks)")
    compile_timeout_s: float = Field(600.0, gt=0, le=3600, description="limit for importing and building the candidate")
    compile_only: bool = Field(False, description="only compile (nvcc/NVRTC diagnostics), even where a GPU is present")
    arch: str | None = Field(None,
                             description="GPU arch for compile-only checks, e.g. sm_90 (default sm_90); built for its "
                                         "arch-specific target (sm_90a) where it has one")
    max_output_chars: int = Field(4000, ge=0, le=200_000,
                                  description="captured stdout/stderr of the candidate kept in the result")
    checks_on: Literal["auto", "device", "host"] = Field(
        "auto",
        description="where the checks of each input set run: auto and device on the GPU wherever its free memory "
                    "holds the pristine copies (else on the host), host always on the host (to compare the two); the "
                    "same checks either way, so not part of the verdict",
    )


# ---------------------------------------------------------------------------------------------
# What the caller's options let a verdict claim (docs/architecture.md, "Verdict keys").


class Effect(str, Enum):
    """How one option at a non-default value bears on the verdict."""

    none = "none"  # not part of the verdict (e.g. how much output is kept): left out of the key
    neutral = "neutral"  # part of the key, as strong as the default (e.g. more timed runs)
    quick = "quick"  # a shortened measurement
    custom = "custom"  # stricter or other checks than the defaults
    loosened = "loosened"  # a relaxed check: flags the verdict


@functools.cache
def _defaults() -> VerifyOptions:
    return VerifyOptions()


def _more_is_looser(value: float, default: float) -> Effect:
    return Effect.loosened if value > default else Effect.custom


# One entry per VerifyOptions field (a test keeps it complete): the effect of a non-default value.
_EFFECTS: dict[str, Callable[[Any, Any], Effect]] = {
    "input_sets": lambda v, d: Effect.custom,  # more sets: stricter
    "seeds": lambda v, d: Effect.custom,  # extra fixed seeds: stricter
    "atol": lambda v, d: Effect.custom,  # looser than the problem's: see `tolerance_loosened`
    "rtol": lambda v, d: Effect.custom,
    "timing": lambda v, d: Effect.quick,
    "timed_runs": lambda v, d: Effect.neutral if v >= 100 else Effect.quick,  # the automatic count is 10 to 100
    "warmup_runs": lambda v, d: Effect.neutral if v >= d else Effect.quick,
    "compile_baseline": lambda v, d: Effect.quick,  # judged against eager alone
    "allow": lambda v, d: Effect.loosened,
    "implausible_speedup": _more_is_looser,
    "timeout_s": _more_is_looser,
    "compile_timeout_s": _more_is_looser,
    "compile_only": lambda v, d: Effect.none,  # the mode: a verdict without a device is compile-only
    "arch": lambda v, d: Effect.custom,  # another compile target than the default
    "max_output_chars": lambda v, d: Effect.none,
    "checks_on": lambda v, d: Effect.none,  # where the same checks run, not what they check
    # Another track is its own score key (its verdicts are compared with that track's only), not a
    # loosening: a tf32 verdict with every other option at its default is `standard` in tf32.
    "track": lambda v, d: Effect.neutral,
    # Composed mode is a reading of its own (kept in the key and beside the track, never mixed with
    # own-kernel verdicts), not a loosening: its rule is as strict as the default's for what it allows.
    "mode": lambda v, d: Effect.neutral,
}
_GPU_IGNORES = frozenset({"arch"})  # a GPU run builds for its own GPU


class OptionsAssessment(BaseModel):
    """What a verdict checked with some options can claim."""

    model_config = ConfigDict(extra="forbid")

    options: dict[str, JsonValue] = Field(default_factory=dict)  # non-default options in the key
    strength: Strength
    loosened: list[str] = Field(default_factory=list)


def assess_options(options: VerifyOptions, *, gpu: bool, tolerance_loosened: str = "") -> OptionsAssessment:
    """The options that bear on a verdict, and its strength.

    `gpu`: the verdict comes from a GPU run (else compile-only). `tolerance_loosened`: the worker's
    note when the caller's atol/rtol were looser than the problem's (only the worker knows the
    output's dtype, so only it can tell a loosened tolerance from a tightened one).
    Strength: any loosening makes it `loosened`; else any stricter or other setting `custom`;
    else a compile-only verdict `compile_only`; else a shortened measurement `quick`; else `standard`.
    """
    defaults, given = _defaults(), options.model_dump(mode="json")
    kept: dict[str, JsonValue] = {}
    effects: set[Effect] = set()
    loosened: list[str] = []
    for name in type(options).model_fields:
        value, default = getattr(options, name), getattr(defaults, name)
        if value == default or (gpu and name in _GPU_IGNORES):
            continue
        effect = _EFFECTS.get(name, lambda v, d: Effect.custom)(value, default)  # unknown: never credited
        if name in ("atol", "rtol") and tolerance_loosened:
            effect = Effect.loosened
        if effect == Effect.none:
            continue
        kept[name] = given[name]
        effects.add(effect)
        if effect == Effect.loosened:
            loosened.append(tolerance_loosened if name in ("atol",
                                                           "rtol") else f"{name}={kept[name]} (default {default})")
    if Effect.loosened in effects:
        strength = Strength.loosened
    elif Effect.custom in effects:
        strength = Strength.custom
    elif not gpu:
        strength = Strength.compile_only
    elif Effect.quick in effects:
        strength = Strength.quick
    else:
        strength = Strength.standard
    return OptionsAssessment(options=kept, strength=strength, loosened=list(dict.fromkeys(loosened)))
