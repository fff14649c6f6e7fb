"""Which parameters of ModelNew hold which parameters of Model, for the parameter-perturbation check.

The check gives a reference parameter and the candidate's copy of it the same new random values
and runs both again: a candidate that computes with constants, or with copies made in `__init__`,
fails. Candidates name their parameters as they like (`self.w` for `self.linear.weight`), so the
match comes from the modules' structure, in this order:

1. the same name, shape and dtype;
2. the same values: both models are built after the same seed, so a candidate that creates its
   parameters as the reference does holds bit-identical copies (equal-valued parameters form one
   group and all get the same new values, so no guess is needed between them);
3. the only free parameter of that shape and dtype on both sides.

What matches none of these is named in the result ("could not run for ..."), never skipped in
silence. `map_parameters` is plain Python over `ParamInfo`s (tested on CPU); `parameter_infos`
and `perturb` touch tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kb_mcp.harness.worker.values import digest

__all__ = ["ParamGroup", "ParamInfo", "ParamMapping", "map_parameters", "parameter_infos", "perturb"]


@dataclass(frozen=True)
class ParamInfo:
    """One floating parameter: its name, shape, dtype and a digest of its values."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    digest: str = ""

    @property
    def kind(self) -> tuple[tuple[int, ...], str]:
        """What must agree for two parameters to be one: shape and dtype."""
        return self.shape, self.dtype


@dataclass(frozen=True)
class ParamGroup:
    """Reference parameters and the candidate's that all get the same new values."""

    ref: tuple[str, ...]
    cand: tuple[str, ...]
    how: str  # name | value | shape


@dataclass
class ParamMapping:
    """The groups to perturb, and the reference parameters nothing of the candidate matched."""

    groups: list[ParamGroup] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)

    def note(self) -> str:
        """Why (part of) the check could not run; "" when every parameter matched."""
        if not self.unmatched:
            return ""
        names = ", ".join(self.unmatched[:6]) + (" ..." if len(self.unmatched) > 6 else "")
        return (f"could not run for {names}: no parameter of ModelNew has the same name, the same values or "
                "the only matching shape (keep parameters as nn.Parameter in the reference's shapes)")


def map_parameters(ref: Sequence[ParamInfo], cand: Sequence[ParamInfo]) -> ParamMapping:
    """Matches the reference's parameters to the candidate's by name, then value, then a unique shape."""
    mapping = ParamMapping()
    free_ref = list(ref)
    free_cand = list(cand)

    def take(rs: list[ParamInfo], cs: list[ParamInfo], how: str) -> None:
        mapping.groups.append(ParamGroup(tuple(r.name for r in rs), tuple(c.name for c in cs), how))
        for r in rs:
            free_ref.remove(r)
        for c in cs:
            free_cand.remove(c)

    by_name = {c.name: c for c in cand}
    for r in list(free_ref):
        c = by_name.get(r.name)
        if c is not None and c in free_cand and c.kind == r.kind:
            take([r], [c], "name")
    for r in list(free_ref):
        if r not in free_ref or not r.digest:
            continue
        twins = [x for x in free_ref if x.kind == r.kind and x.digest == r.digest]
        copies = [c for c in free_cand if c.kind == r.kind and c.digest == r.digest]
        if copies:
            take(twins, copies, "value")
    for r in list(free_ref):
        same_ref = [x for x in free_ref if x.kind == r.kind]
        same_cand = [c for c in free_cand if c.kind == r.kind]
        if len(same_ref) == 1 and len(same_cand) == 1:
            take(same_ref, same_cand, "shape")
    mapping.unmatched = [r.name for r in free_ref]
    return mapping


def _digest(t: torch.Tensor) -> str:
    """A fingerprint of the parameter's bytes, taken where it lives (`values.digest`): a copy to the
    host and a hash there took seconds for a weight of hundreds of MB, holding the GPU lane. Equal
    digests pair parameters for the same new values; the values are the reference's secret-seeded
    ones, which a candidate cannot aim a collision at, and a wrong pair only perturbs the candidate
    more."""
    return ":".join(str(part) for part in digest(t.detach()))


def parameter_infos(model: torch.nn.Module) -> tuple[list[ParamInfo], dict[str, torch.nn.Parameter]]:
    """The floating parameters of `model` (in registration order) with digests, and by name."""
    params = {n: p for n, p in model.named_parameters() if p.is_floating_point()}
    infos = [ParamInfo(n, tuple(p.shape), str(p.dtype), _digest(p)) for n, p in params.items()]
    return infos, params


def perturb(mapping: ParamMapping, ref: dict[str, torch.nn.Parameter], cand: dict[str, torch.nn.Parameter],
            seed: int, draw: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None) -> None:
    """New values for every group, the same in each of its parameters (reference and candidate)."""
    g = torch.Generator(device=next(iter(ref.values())).device if ref else "cpu")
    g.manual_seed(seed)
    draw = draw or _spread_draw
    for group in mapping.groups:
        first = ref[group.ref[0]]
        new = draw(first, g).to(first.dtype)
        for name in group.ref:
            ref[name].data.copy_(new)
        for name in group.cand:
            cand[name].data.copy_(new)


def _spread_draw(r: torch.Tensor, g: torch.Generator) -> Any:
    """The parameter moved by half its own spread (its magnitude, or 1, when it is constant)."""
    rf = r.detach().float()
    spread = float(rf.std().item()) if r.numel() > 1 else 0.0
    if not spread or spread != spread:
        spread = max(abs(float(rf.mean().item())), 1.0)
    return rf + 0.5 * spread * torch.randn(r.shape, generator=g, device=r.device)
