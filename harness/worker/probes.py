"""Precision probes (worker side, torch): a candidate whose SASS computes on the tensor cores below
its track's precision is run on inputs chosen to show it, beside the track's reference and a float64
copy of the reference; the rule that judges the numbers is `harness.judgment.probing`'s.

One probe at a time (problems can be many GB): its inputs are made from a fresh secret seed as the
checks make theirs and rewritten per floating input tensor (`probe_inputs`; integer indices and
masks untouched); the float64 reference (the Model deep-copied and converted, inputs upcast) runs
first and its copy is dropped at once; then the strict reference (the Model with TF32 off, on every
track: `numerics` gives the settings), whose output stays alive while
the candidate runs on its own clone (the caller poisons the allocator, as in the checks); the
errors are reduced to a few numbers and everything is freed before the next probe. A float64
reference that fails (a dtype its forward fixes, too little memory) or is not finite skips that
probe with a note; the candidate's own failures are its verdict (the caller raises them).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from kb_mcp.harness.judgment.probing import (
    ARBITER,
    FLOOR_UNITS,
    PROBES,
    PrecisionCheck,
    ProbeError,
    error_ratio,
    judged,
)
from kb_mcp.harness.worker.values import clone_inputs, leaves, secret_seed

LOW_BITS = (13, 20)  # j of 1 + k·2^-j: TF32 keeps 10 mantissa bits, float32 23
MAGNITUDES = 8  # mixed_magnitudes: factors 2^-8 .. 2^8


def _scale(x: torch.Tensor) -> float:
    """The power of two nearest the tensor's RMS (1 for an empty, zero or non-finite one)."""
    if x.numel() == 0:
        return 1.0
    rms = float(x.detach().double().pow(2).mean().sqrt().item())
    return 2.0 ** round(math.log2(rms)) if rms > 0 and math.isfinite(rms) else 1.0


def low_bits(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """±2^e·(1 + k·2^-j): e from the tensor's RMS, the sign from x, j uniform in 13..20 and
    1 <= k < 2^(j-11), so every value is below half a TF32 unit away from ±2^e: TF32 (and bf16,
    fp16) rounds it to the power of two, float32 holds it exactly."""
    lo, hi = LOW_BITS
    j = torch.randint(lo, hi + 1, x.shape, generator=g, device=x.device).double()
    k = torch.floor(torch.rand(x.shape, generator=g, device=x.device, dtype=torch.float64) * (2.0 ** (j - 11) - 1)) + 1
    sign = torch.where(x < 0, -1.0, 1.0).double()
    return (sign * _scale(x) * (1.0 + k * torch.pow(2.0, -j))).to(x.dtype)


def mixed_magnitudes(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """x times a random power of two from 2^-8 to 2^8 per element (exact in float32)."""
    e = torch.randint(-MAGNITUDES, MAGNITUDES + 1, x.shape, generator=g, device=x.device).double()
    return (x.double() * torch.pow(2.0, e)).to(x.dtype)


def same_sign(x: torch.Tensor, _g: torch.Generator) -> torch.Tensor:
    """|x|: every partial sum of a reduction over it grows, as in a long accumulation."""
    return x.abs()


_REWRITE: dict[str, Callable[[torch.Tensor, torch.Generator], torch.Tensor]] = {
    "low_bits": low_bits, "mixed_magnitudes": mixed_magnitudes, "same_sign": same_sign,
}


def probe_inputs(probe: str, xs: Iterable[Any], seed: int) -> list[Any]:
    """One input set as `probe` rewrites it: floating tensors only (`own` keeps them as they are)."""
    out: list[Any] = []
    gens: dict[str, torch.Generator] = {}
    for x in xs:
        if probe != "own" and isinstance(x, torch.Tensor) and x.is_floating_point():
            g = gens.get(str(x.device))
            if g is None:
                g = gens[str(x.device)] = torch.Generator(device=x.device)
                g.manual_seed(seed)
            x = _REWRITE[probe](x, g)
        out.append(x)
    return out


def float64_reference(reference: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of the reference (its parameters and floating buffers converted)."""
    return copy.deepcopy(reference).double()


def upcast(xs: Iterable[Any]) -> list[Any]:
    """Floating tensors as float64 copies; everything else as it is."""
    return [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]


def _finite(ts: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all().item()) for t in ts if t.is_floating_point())


def errors(out: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(RMS, largest) of |out - exact| in float64; a non-finite element is an infinite error."""
    d = (out.detach().double() - exact).abs()
    d = torch.where(torch.isfinite(d), d, torch.full_like(d, math.inf))
    return float(d.pow(2).mean().sqrt().item()), float(d.max().item())


def _floor(exact: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    unit = FLOOR_UNITS * torch.finfo(dtype).eps / 2
    return unit * float(exact.pow(2).mean().sqrt().item()), unit * float(exact.abs().max().item())


def compare(name: str, candidate: Any, reference: list[torch.Tensor],
            exact: list[torch.Tensor]) -> ProbeError:
    """The probe's numbers: per floating output the ratio of `harness.judgment.probing.error_ratio`, the
    worst output's kept. An output that cannot be compared is an infinite ratio."""
    got = leaves(candidate)
    if got is None or len(got) != len(exact):
        return ProbeError(probe=name, ratio=math.inf, note="the output is not the reference's tensors")
    worst: ProbeError | None = None
    for c, r, e in zip(got, reference, exact):
        if not r.is_floating_point() or r.numel() == 0:
            continue
        if c.shape != r.shape:
            return ProbeError(probe=name, ratio=math.inf, note=f"an output is {tuple(c.shape)}, not {tuple(r.shape)}")
        c_rms, c_max = errors(c, e)
        r_rms, r_max = errors(r, e)
        f_rms, f_max = _floor(e, r.dtype)
        found = ProbeError(probe=name, ratio=error_ratio(c_rms, c_max, r_rms, r_max, f_rms, f_max),
                           candidate_rms=c_rms, candidate_max=c_max, reference_rms=r_rms, reference_max=r_max,
                           floor_rms=f_rms, floor_max=f_max)
        if worst is None or (found.ratio or 0.0) > (worst.ratio or 0.0):
            worst = found
    return worst or ProbeError(probe=name, note="no floating output to compare")


def _exact(reference: torch.nn.Module, xs: list[Any]) -> tuple[list[torch.Tensor] | None, str]:
    """The float64 reference's output for `xs` (None and why when it could not be had); the float64
    copy of the model is gone when this returns."""
    model = None
    try:
        model = float64_reference(reference)
        out = leaves(model(*upcast(xs)))
    except torch.OutOfMemoryError:
        return None, "the float64 reference ran out of GPU memory"
    except Exception as exc:  # noqa: BLE001 - the problem's Model in float64 may fail in any way
        return None, f"the float64 reference failed: {type(exc).__name__}: {str(exc).strip()[:200]}"
    finally:
        del model
    if out is None:
        return None, "the float64 reference returns something other than tensors"
    if not _finite(out):
        return None, "the float64 reference is not finite on these inputs"
    return [t.double() if t.is_floating_point() else t for t in out], ""


Numerics = Callable[[], AbstractContextManager[Any]]


def run_probe(name: str, reference: torch.nn.Module, xs: list[Any], run_candidate: Callable[[list[Any], Any], Any],
              numerics: Numerics = contextlib.nullcontext) -> ProbeError:
    """One probe on `xs` (already rewritten): float64 reference, the strict reference (under
    `numerics()`), then the candidate (`run_candidate(args, reference_output)`, which raises for
    the candidate's failures)."""
    exact, why = _exact(reference, xs)
    if exact is None:
        return ProbeError(probe=name, note=why)
    try:
        with numerics():
            ref_out = reference(*clone_inputs(xs))
    except Exception as exc:  # noqa: BLE001 - the problem's Model may reject the probe's values
        return ProbeError(probe=name, note=f"the strict reference failed: {type(exc).__name__}: {str(exc)[:200]}")
    ref_leaves = leaves(ref_out)
    if ref_leaves is None or len(ref_leaves) != len(exact) or not _finite(ref_leaves):
        return ProbeError(probe=name, note="the strict reference is not finite on these inputs")
    candidate = run_candidate(clone_inputs(xs), ref_out)
    return compare(name, candidate, ref_leaves, exact)


def against_float64(reference: torch.nn.Module, xs: list[Any], candidate: list[torch.Tensor],
                    strict: list[torch.Tensor]) -> ProbeError:
    """The float64 arbitration of an input set the candidate failed by a rounding-sized margin: the
    candidate's outputs (`candidate`) and the strict reference's (`strict`, already computed on
    `xs`) both measured against a float64 copy of the reference on the same inputs, by the probes'
    rule (`harness.judgment.probing.error_ratio`). `xs` are the set's pristine inputs, on the host or the
    device (copied to the outputs' device here). A float64 reference that cannot run (memory, a
    forward that raises in float64) leaves the ratio unset with the reason, and the failure stands."""
    device = strict[0].device if strict else torch.device("cpu")
    try:
        on_device = [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]
    except torch.OutOfMemoryError:
        return ProbeError(probe=ARBITER, note="the float64 reference ran out of GPU memory")
    exact, why = _exact(reference, on_device)
    del on_device
    if exact is None:
        return ProbeError(probe=ARBITER, note=why)
    # A forward that fixes its dtype computes the "float64" copy as the strict reference does: the
    # strict error is then 0, raised to its floor, and the candidate's rounding-sized error exceeds it.
    return compare(ARBITER, candidate, strict, exact)


def run_probes(check: PrecisionCheck, reference: torch.nn.Module, make_inputs: Callable[[], list[Any]],
               run_candidate: Callable[[list[Any], Any], Any], probes: Iterable[str] = PROBES,
               numerics: Numerics = contextlib.nullcontext) -> PrecisionCheck:
    """Every probe, one at a time (`run_probe`), freed before the next; `check` judged by their
    numbers (`harness.judgment.probing.judged`). `make_inputs()` gives a fresh input set of the problem's;
    a probe that rewrites floating inputs is skipped when there are none. `numerics()` puts torch
    in the strict settings for the reference's runs (the worker: `tracks.strict_numerics`)."""
    found: list[ProbeError] = []
    for name in probes:
        xs = make_inputs()
        if name != "own" and not any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in xs):
            found.append(ProbeError(probe=name, note="no floating input to rewrite"))
            continue
        xs = probe_inputs(name, xs, secret_seed())
        with torch.no_grad():
            found.append(run_probe(name, reference, xs, run_candidate, numerics))
        del xs
        _release()
    return judged(check, found)


def _release() -> None:
    """Hands the probe's cached blocks back before the next one (its tensors are gone already)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
