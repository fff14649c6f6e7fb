"""Values the checks work with (worker side, torch): output leaves, tolerances, the elementwise
comparison, the allocator's poison, and the seeds input sets are drawn from.

Tolerances: `|c - r| <= atol * RMS(r) + rtol * |r|` elementwise. Defaults per output dtype in
`DEFAULT_TOLERANCES`; a problem file may set module-level `ATOL` and `RTOL` floats; the caller's
options override both (a looser value flags the result for review).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from kb_mcp.harness.options import TRACK_TOLERANCE, VerifyOptions

# (atol in units of the reference's RMS, rtol) per output dtype. fp32 is strict: the reference runs
# with TF32 off, and a candidate that computes in TF32/bf16 shows errors near 1e-3 and fails here.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
    "float8_e4m3fn": (1e-1, 1e-1),
    "float8_e5m2": (2e-1, 2e-1),
}
PUBLIC_SEED = 42  # the seed KernelBench-style harnesses use; a candidate may guess it, which is the point
POISON_BYTE = 0xFF  # 0xFFFF.. is NaN in every float format, and not the canonical NaN kernels produce
MAX_PERTURBED_INPUTS = 6
# A failing fp32/fp64 output whose largest error is at most this fraction of its RMS looks like
# lowered precision (TF32 ~1e-3, bf16 ~1e-2) rather than a wrong algorithm.
LOWERED_PRECISION_ERR = 3e-2


def secret_seed() -> int:
    """A fresh seed from the OS, drawn only when it is used."""
    return int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)



def leaves(out: Any) -> list[Any] | None:
    """The tensors of an output (a tensor, or a tuple/list of tensors); None for anything else."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(x, torch.Tensor) for x in out):
        return list(out)
    return None


def tolerance_for(dtype: torch.dtype, problem_atol: float | None, problem_rtol: float | None,
                  options: VerifyOptions) -> tuple[float, float, str]:
    """(atol, rtol, loosened-note) for an output of `dtype`: the dtype's (or the problem's own),
    raised to the track's floor (`options.TRACK_TOLERANCE`) on a low-precision track."""
    name = str(dtype).replace("torch.", "")
    base_a, base_r = DEFAULT_TOLERANCES.get(name, (0.0, 0.0))
    if problem_atol is not None:
        base_a = float(problem_atol)
    if problem_rtol is not None:
        base_r = float(problem_rtol)
    floor = TRACK_TOLERANCE[options.track]
    if floor is not None and (dtype.is_floating_point or dtype.is_complex):
        base_a, base_r = max(base_a, floor[0]), max(base_r, floor[1])
    atol = base_a if options.atol is None else options.atol
    rtol = base_r if options.rtol is None else options.rtol
    note = ""
    if atol > base_a or rtol > base_r:
        note = (f"tolerance loosened by the caller to atol={atol:g}, rtol={rtol:g} (the problem's is atol={base_a:g}, "
                f"rtol={base_r:g})")
    return atol, rtol, note


@dataclass
class Comparison:
    """One output tensor against its reference."""

    passed: bool
    max_abs: float | None = None
    max_rel: float | None = None
    scaled: float | None = None
    mismatched: int = 0
    numel: int = 0
    nonfinite: int = 0
    poison: int = 0
    constant: bool = False
    message: str = ""


def poison_count(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    raw = t.detach().contiguous().view(-1).view(torch.uint8).view(-1, t.element_size())
    return int((raw == POISON_BYTE).all(dim=1).sum().item())


def compare(c: torch.Tensor, r: torch.Tensor, atol: float, rtol: float, detail: bool = True) -> Comparison:
    """Elementwise check of `c` against `r` (NaN/Inf in `c` never pass).

    `detail=False` (the re-check of timed outputs) decides pass or fail by the same arithmetic but
    skips the statistics of a passing output (error maxima, constant-output test); a failing one
    gets them all, for its message.
    """
    n = r.numel()
    if not r.is_floating_point() and not r.is_complex():
        poison = poison_count(c)
        bad = int((c != r).sum().item())
        return Comparison(passed=bad == 0, mismatched=bad, numel=n, poison=poison,
                          max_abs=float((c.long() - r.long()).abs().max().item()) if n else 0.0,
                          message="" if bad == 0 else f"{bad} of {n} elements differ (exact match required)")
    work = torch.float64 if r.dtype == torch.float64 else torch.float32
    rf = r.detach().to(work)
    cf = c.detach().to(work)
    finite_r = torch.isfinite(rf)
    finite_c = torch.isfinite(cf)
    if bool(finite_r.all().item()):  # the usual case: no mask to gather through
        scale = float(rf.pow(2).mean().sqrt().item()) if n else 1.0
    else:
        scale = float(rf[finite_r].pow(2).mean().sqrt().item()) if bool(finite_r.any()) else 1.0
    if scale == 0.0 or scale != scale:
        scale = 1.0
    diff = (cf - rf).abs()
    ok = diff <= (atol * scale + rtol * rf.abs())
    ok &= finite_c
    if not detail and bool(ok.all().item()):
        return Comparison(passed=True, numel=n)
    mismatched = int((~ok).sum().item())
    nonfinite = int((~finite_c).sum().item())
    # Poison bytes are NaN in every float format, so only a failing float output can hold any.
    poison = poison_count(c) if mismatched else 0
    both = finite_c & finite_r
    max_abs = float(diff[both].max().item()) if bool(both.any()) else None
    big = both & (rf.abs() > 1e-3 * scale)
    max_rel = float((diff[big] / rf[big].abs()).max().item()) if bool(big.any()) else None
    constant = n > 1 and bool(finite_c.all()) and float(cf.max().item()) == float(cf.min().item()) and \
        bool(finite_r.all()) and float(rf.max().item()) != float(rf.min().item())
    message = ""
    if mismatched:
        parts = [f"{mismatched} of {n} elements outside the tolerance"]
        if nonfinite:
            parts.append(f"{nonfinite} NaN/Inf")
        if poison:
            parts.append(f"{poison} still hold the harness's poison bytes (never written)")
        if max_abs is not None:
            parts.append(f"max abs err {max_abs:.3g} (scale {scale:.3g})")
        message = "; ".join(parts)
    return Comparison(passed=mismatched == 0, max_abs=max_abs, max_rel=max_rel,
                      scaled=None if max_abs is None else max_abs / scale, mismatched=mismatched, numel=n,
                      nonfinite=nonfinite, poison=poison, constant=constant, message=message)


def poison_allocator(nbytes: list[int]) -> None:
    """Fills cached allocator blocks of these sizes with poison, then frees them for reuse."""
    bufs = []
    for n in nbytes:
        if n > 0:
            b = torch.empty(n, dtype=torch.uint8, device="cuda")
            b.fill_(POISON_BYTE)
            bufs.append(b)
    del bufs


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def overlaps(a: torch.Tensor, others: list[torch.Tensor]) -> bool:
    a0, a1 = _storage_span(a)
    if a1 == a0:
        return False
    for o in others:
        b0, b1 = _storage_span(o)
        if b1 > b0 and a0 < b1 and b0 < a1:
            return True
    return False


def clone_inputs(xs: list[Any]) -> list[Any]:
    """Tensors cloned, everything else as is (each call gets inputs of its own)."""
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all().item())
    return False



def largest(values: Any) -> float | None:
    vals = [x for x in values if x is not None]
    return max(vals) if vals else None

