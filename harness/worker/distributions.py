"""Input sets of a different distribution (worker side; imports torch): the problem's own inputs
with their signs, magnitudes and special values changed, so that a kernel right only on the usual
distribution fails somewhere.

Most KernelBench problems draw their inputs with `torch.rand` (every value in [0, 1)). A kernel
that is right only for non-negative inputs (a ReLU dropped before an op that keeps the sign, an
`abs` left out, a clamp's lower bound dropped, a max reduction started at 0 instead of -inf)
passes every set drawn that way. The checks therefore run `SETS`, two combined variant sets, each
made from a fresh set of the problem's own inputs by `vary`:

* **mixed**: every element's sign drawn at random, magnitudes stretched by a factor log-uniform in
  [1/8, 8], and a few elements set to exact zeros, to values around activation knees (0, +-1, +-3,
  +-6: ReLU, hardtanh, hardswish, ReLU6), across [-8, 8], or to tiny magnitudes (1e-4 to 1e-2);
* **negated**: every input negated as a whole, magnitudes stretched 1.5-6x unevenly (where
  `torch.rand` gave all-positive inputs, all-negative ones).

Each has a gentler fallback, used where the reference is not finite on it (it divides by an input,
takes its logarithm or square root, or overflows at large magnitudes): signs mixed with magnitudes
1/2-2x only; and the stretched magnitudes with signs kept (the one set the checks ran before). A set
whose fallback is not finite either is skipped, and the result says so.

Only floating tensors change; integer and boolean tensors (an index, a class label, a mask) and
everything that is not a tensor stay exactly as the problem made them, so they stay valid. Each
tensor gets random numbers of its own, from a generator seeded by the set's seed and the tensor's
position: the same seed gives the same set. The work is done in chunks, so a large input costs
one copy of itself and a bounded scratch space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SETS", "Variant", "vary"]

CHUNK = 1 << 22  # elements varied at a time: bounds the scratch space a large input needs
KNEES = (0.0, 1.0, -1.0, 3.0, -3.0, 6.0, -6.0)  # where ReLU, hardtanh, hardswish and ReLU6 change their shape
KNEE_WIDTH = 0.05  # knee values are spread this far on either side of their knee
SPREAD = 8.0  # some values spread evenly over [-SPREAD, SPREAD], past every knee
TINY = (1e-4, 1e-2)  # the range of the tiny magnitudes


@dataclass(frozen=True)
class Variant:
    """How one different-distribution set changes each floating input (see the module's docstring)."""

    name: str  # what it changes, as a finding names it
    negate: float = 0.0  # each element's chance to change sign (1.0: the whole tensor negated)
    scale: tuple[float, float] = (1.0, 1.0)  # the whole tensor times a factor uniform in this range
    stretch: tuple[float, float] = (1.0, 1.0)  # each element times a factor log-uniform in this range
    zeros: float = 0.0  # fraction of elements set to exactly 0
    knees: float = 0.0  # fraction set around activation knees, and across [-SPREAD, SPREAD]
    tiny: float = 0.0  # fraction set to tiny magnitudes (either sign)


MIXED = Variant(
    name="signs mixed per element, zeros, values around activation knees (0, ±1, ±3, ±6) and tiny values, "
         "magnitudes stretched 1/8-8x",
    negate=0.5, stretch=(0.125, 8.0), zeros=0.02, knees=0.1, tiny=0.02,
)
MIXED_GENTLY = Variant(name="signs mixed per element, magnitudes 1/2-2x", negate=0.5, stretch=(0.5, 2.0))
NEGATED = Variant(name="every input negated, magnitudes stretched 1.5-6x unevenly", negate=1.0, scale=(1.5, 3.0),
                  stretch=(1.0, 2.0))
STRETCHED = Variant(name="magnitudes stretched 1.5-6x unevenly, signs kept", scale=(1.5, 3.0), stretch=(1.0, 2.0))
# The sets the checks run, each with the variant tried where the first leaves the reference not finite.
SETS: tuple[tuple[Variant, ...], ...] = ((MIXED, MIXED_GENTLY), (NEGATED, STRETCHED))


def vary(xs: list[Any], seed: int, variant: Variant) -> list[Any]:
    """The input set `xs` with each floating tensor changed as `variant` says (new tensors of the
    same shape, dtype, device and layout); everything else as it was. Deterministic in `seed`."""
    out = []
    for i, x in enumerate(xs):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            x = _vary_one(x, _seed_of(seed, i), variant)
        out.append(x)
    return out


def _seed_of(seed: int, position: int) -> int:
    """A generator seed of its own for the input at `position`."""
    return (seed ^ (0x9E3779B97F4A7C15 * (position + 1))) & ((1 << 63) - 1)


def _vary_one(x: torch.Tensor, seed: int, v: Variant) -> torch.Tensor:
    g = torch.Generator(device=x.device)
    g.manual_seed(seed)
    factor = v.scale[0] + (v.scale[1] - v.scale[0]) * float(torch.rand((), generator=g, device=x.device).item())
    out = torch.empty_like(x)  # the problem's own layout where it is dense (channels-last, a transpose)
    flat = out if out.is_contiguous() else torch.empty_like(x, memory_format=torch.contiguous_format)
    src, dst = x.reshape(-1), flat.view(-1)  # reshape copies only an input that is not contiguous
    for start in range(0, src.numel(), CHUNK):
        dst[start:start + CHUNK] = _vary_chunk(src[start:start + CHUNK].float(), g, v, factor).to(x.dtype)
    if flat is not out:
        out.copy_(flat)
    return out


def _vary_chunk(y: torch.Tensor, g: torch.Generator, v: Variant, factor: float) -> torch.Tensor:
    """One chunk, in float32 (a copy: `y` may be the problem's own tensor)."""
    def uniform() -> torch.Tensor:
        return torch.rand(y.shape, generator=g, device=y.device)

    lo, hi = math.log(v.stretch[0]), math.log(v.stretch[1])
    y = y * (factor * torch.exp(lo + (hi - lo) * uniform()))
    if v.negate:
        y = torch.where(uniform() < v.negate, -y, y)
    if v.knees:
        knees = torch.tensor(KNEES, device=y.device)[torch.randint(len(KNEES), y.shape, generator=g, device=y.device)]
        near = knees + KNEE_WIDTH * (2 * uniform() - 1)
        spread = SPREAD * (2 * uniform() - 1)
        pick = uniform()
        y = torch.where(pick < v.knees / 2, near, torch.where(pick < v.knees, spread, y))
    if v.tiny:
        lo_t, hi_t = math.log(TINY[0]), math.log(TINY[1])
        tiny = torch.exp(lo_t + (hi_t - lo_t) * uniform()) * torch.where(uniform() < 0.5, -1.0, 1.0)
        y = torch.where(uniform() < v.tiny, tiny, y)
    if v.zeros:
        y = torch.where(uniform() < v.zeros, torch.zeros((), device=y.device), y)
    return y
