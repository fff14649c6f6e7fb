"""Matching Model's parameters to ModelNew's for the perturbation check (`harness.worker.perturb`), on CPU."""

from __future__ import annotations

import torch
import torch.nn as nn

from kb_mcp.harness.worker.perturb import ParamInfo, map_parameters, parameter_infos, perturb


class Reference(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x)).sum(dim=1, keepdim=True)


class Renamed(nn.Module):
    """The same computation, its parameters under other names (as `nn.Linear` and `nn.LayerNorm` made them)."""

    def __init__(self) -> None:
        super().__init__()
        lin, norm = nn.Linear(16, 8), nn.LayerNorm(8)
        self.w, self.b = lin.weight, lin.bias
        self.gamma, self.beta = norm.weight, norm.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.w, self.b)
        return nn.functional.layer_norm(y, (8,), self.gamma, self.beta).sum(dim=1, keepdim=True)


def _built(cls: type[nn.Module], seed: int = 7) -> nn.Module:
    torch.manual_seed(seed)
    return cls()


def test_renamed_parameters_are_matched_by_their_values() -> None:
    ref, cand = _built(Reference), _built(Renamed)
    (ri, rp), (ci, cp) = parameter_infos(ref), parameter_infos(cand)
    mapping = map_parameters(ri, ci)
    assert mapping.unmatched == [] and mapping.note() == ""
    pairs = {(g.ref, g.cand, g.how) for g in mapping.groups}
    assert (("linear.weight",), ("w",), "value") in pairs and (("linear.bias",), ("b",), "value") in pairs
    # LayerNorm's weight (ones) and bias (zeros) differ from each other, so each has its own group.
    assert (("norm.weight",), ("gamma",), "value") in pairs and (("norm.bias",), ("beta",), "value") in pairs
    # After the same new values in both, the renamed candidate still computes what the reference does.
    perturb(mapping, rp, cp, seed=3)
    assert not torch.equal(rp["norm.weight"], torch.ones(8))
    x = torch.randn(4, 16)
    torch.testing.assert_close(cand(x), ref(x))


def test_a_candidate_that_does_not_read_a_matched_parameter_shows_after_perturbation() -> None:
    class Stale(Renamed):
        def __init__(self) -> None:
            super().__init__()
            self.frozen_w = self.w.detach().clone()  # a derived copy: not a parameter

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = nn.functional.linear(x, self.frozen_w, self.b)
            return nn.functional.layer_norm(y, (8,), self.gamma, self.beta).sum(dim=1, keepdim=True)

    ref, cand = _built(Reference), _built(Stale)
    (ri, rp), (ci, cp) = parameter_infos(ref), parameter_infos(cand)
    x = torch.randn(4, 16)
    torch.testing.assert_close(cand(x), ref(x))  # right before the perturbation
    perturb(map_parameters(ri, ci), rp, cp, seed=3)
    assert not torch.allclose(cand(x), ref(x))


def test_names_win_then_values_then_a_unique_shape() -> None:
    ref = [ParamInfo("a", (4,), "f32", "x"), ParamInfo("b", (4, 4), "f32", "y"), ParamInfo("c", (2,), "f32", "z")]
    cand = [ParamInfo("a", (4,), "f32", "other"), ParamInfo("q", (4, 4), "f32", "y"), ParamInfo("r", (2,), "f32", "w")]
    mapping = map_parameters(ref, cand)
    assert [(g.ref, g.cand, g.how) for g in mapping.groups] == [
        (("a",), ("a",), "name"), (("b",), ("q",), "value"), (("c",), ("r",), "shape")]


def test_equal_valued_parameters_form_one_group() -> None:
    ones = "ones-digest"
    ref = [ParamInfo("n1.weight", (8,), "f32", ones), ParamInfo("n2.weight", (8,), "f32", ones)]
    cand = [ParamInfo("g2", (8,), "f32", ones), ParamInfo("g1", (8,), "f32", ones)]
    mapping = map_parameters(ref, cand)
    assert [(g.ref, g.cand, g.how) for g in mapping.groups] == [(("n1.weight", "n2.weight"), ("g2", "g1"), "value")]


def test_what_cannot_be_matched_is_named() -> None:
    # Two same-shape parameters with new values and names: which is which cannot be told.
    ref = [ParamInfo("w1", (4, 4), "f32", "a"), ParamInfo("w2", (4, 4), "f32", "b"), ParamInfo("t", (4, 2), "f32", "c")]
    cand = [ParamInfo("p", (4, 4), "f32", "d"), ParamInfo("q", (4, 4), "f32", "e"),
            ParamInfo("t_T", (2, 4), "f32", "f")]
    mapping = map_parameters(ref, cand)
    assert mapping.groups == [] and mapping.unmatched == ["w1", "w2", "t"]
    assert mapping.note().startswith("could not run for w1, w2, t:")
