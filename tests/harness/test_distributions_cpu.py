"""The different-distribution sets (`harness.worker.distributions`) on CPU tensors: what each
variant changes, what it must leave alone, and that kernels right only on non-negative inputs are
wrong on them while honest ones are not."""

from __future__ import annotations

import pytest
import torch

from kb_mcp.harness.worker import distributions
from kb_mcp.harness.worker.distributions import KNEE_WIDTH, KNEES, SETS, Variant, vary

MIXED, MIXED_GENTLY = SETS[0]
NEGATED, STRETCHED = SETS[1]
VARIANTS = [v for pair in SETS for v in pair]


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g)


def test_two_sets_each_with_a_gentler_fallback() -> None:
    assert len(SETS) == 2 and all(len(pair) == 2 for pair in SETS)
    assert len({v.name for v in VARIANTS}) == 4
    # the fallback of the negated set is the set the checks ran before: sign kept, stretched
    assert STRETCHED.negate == 0 and STRETCHED.scale == NEGATED.scale and STRETCHED.stretch == NEGATED.stretch


def test_signs_vary_per_element_in_the_mixed_set_and_as_a_whole_in_the_negated_one() -> None:
    x = _rand(512, 512)  # torch.rand: every value >= 0
    mixed = vary([x], 11, MIXED)[0]
    negative = float((mixed < 0).float().mean())
    assert 0.45 < negative < 0.55, negative
    rows_with_both = ((mixed < 0).any(dim=1) & (mixed > 0).any(dim=1)).float().mean()
    assert rows_with_both == 1.0
    assert float((vary([x], 11, MIXED_GENTLY)[0] < 0).float().mean()) == pytest.approx(0.5, abs=0.05)
    assert bool((vary([x], 11, NEGATED)[0] < 0).all())  # all-negative where the problem gave all-positive
    assert bool((vary([x], 11, STRETCHED)[0] >= 0).all())


def test_the_mixed_set_has_zeros_knees_tiny_and_large_magnitudes() -> None:
    x = _rand(1024, 1024)
    y = vary([x], 5, MIXED)[0]
    n = y.numel()
    assert 0.015 < float((y == 0).float().mean()) < 0.03  # exact zeros (plus the rare tiny one rounding to 0)
    for knee in KNEES:
        near = ((y - knee).abs() <= KNEE_WIDTH).float().sum() / n
        assert near > 0.004, (knee, near)  # about 5 % / 7 knees each, on both sides of each knee
        assert bool(((y > knee) & (y <= knee + KNEE_WIDTH)).any())
        assert bool(((y < knee) & (y >= knee - KNEE_WIDTH)).any())
    tiny = ((y.abs() > 0) & (y.abs() < 1e-2)).float().mean()
    assert tiny > 0.015, tiny
    assert float((y.abs() > 6).float().mean()) > 0.01  # past ReLU6's knee (rand * 8, and the spread over [-8, 8])
    assert float(y.abs().max()) <= 8.0 + 1e-6


def test_the_negated_set_stretches_every_magnitude_unevenly() -> None:
    x = _rand(256, 256) + 0.1
    y = vary([x], 3, NEGATED)[0]
    ratio = (-y / x).flatten()
    assert float(ratio.min()) >= 1.5 - 1e-5 and float(ratio.max()) <= 6.0 + 1e-5
    assert float(ratio.max() / ratio.min()) > 1.8  # uneven: a stretch per element, not one factor


def test_integer_and_boolean_tensors_and_other_values_stay_as_the_problem_made_them() -> None:
    x = _rand(64, 8)
    index = torch.randint(0, 8, (64,))
    mask = _rand(64) > 0.5
    targets = torch.randint(0, 2, (64,), dtype=torch.int8)
    for v in VARIANTS:
        y, i, m, t, k, s = vary([x, index, mask, targets, 3, "mean"], 17, v)
        assert i is index and m is mask and t is targets and (k, s) == (3, "mean")
        assert y is not x and y.shape == x.shape and y.dtype == x.dtype
    assert torch.equal(x, _rand(64, 8))  # the problem's own tensor is never written


def test_the_same_seed_gives_the_same_set_and_each_input_its_own_numbers() -> None:
    a, b = _rand(128, 64, seed=1), _rand(128, 64, seed=2)
    for v in VARIANTS:
        first = vary([a, b], 12345, v)
        again = vary([a, b], 12345, v)
        assert all(torch.equal(p, q) for p, q in zip(first, again))
        other = vary([a, b], 12346, v)
        assert not torch.equal(first[0], other[0])
    twins = vary([a, a.clone()], 9, MIXED)
    assert not torch.equal(twins[0], twins[1])  # two inputs equal in value still get different changes


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtype_shape_and_layout_are_kept(dtype: torch.dtype) -> None:
    x = _rand(2, 3, 8, 8).to(dtype=dtype, memory_format=torch.channels_last)
    y = vary([x], 4, MIXED)[0]
    assert y.dtype == dtype and y.shape == x.shape and y.stride() == x.stride()
    t = _rand(40, 30).to(dtype).t()  # a transposed view, as some problems pass
    yt = vary([t], 4, NEGATED)[0]
    assert yt.stride() == t.stride() and bool((yt < 0).all())
    assert torch.isfinite(y.float()).all()


def test_a_large_input_is_varied_in_chunks_with_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _rand(3, 1000)
    whole = vary([x], 21, MIXED)[0]
    monkeypatch.setattr(distributions, "CHUNK", 1000)  # three chunks instead of one
    chunked = vary([x], 21, MIXED)[0]
    assert chunked.shape == whole.shape and float((chunked < 0).float().mean()) == pytest.approx(0.5, abs=0.05)
    assert torch.equal(vary([x], 21, MIXED)[0], chunked)  # deterministic in the chunking too
    assert float((chunked == 0).float().mean()) == pytest.approx(float((whole == 0).float().mean()), abs=0.02)


# Kernels right only where the inputs are non-negative, and the honest ones, as plain functions.
CASES = {
    "relu dropped": (lambda x: torch.relu(x) * 2, lambda x: x * 2),
    "abs dropped": (lambda x: torch.abs(x) * 3 - 1, lambda x: x * 3 - 1),
    "clamp's lower bound dropped": (lambda x: torch.clamp(x, min=-0.5, max=0.75), lambda x: torch.clamp(x, max=0.75)),
    "max started at 0": (lambda x: x.amax(dim=1), lambda x: x.clamp(min=0).amax(dim=1)),
    "hardswish's clamp dropped": (lambda x: torch.nn.functional.hardswish(x), lambda x: x * (x + 3) / 6),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernels_right_only_on_non_negative_inputs_are_wrong_on_a_set(name: str) -> None:
    reference, shortcut = CASES[name]
    x = _rand(256, 512)
    assert torch.allclose(reference(x), shortcut(x))  # every torch.rand set passes
    caught = [v.name for v in (MIXED, NEGATED) if not torch.allclose(reference(vary([x], 8, v)[0]),
                                                                      shortcut(vary([x], 8, v)[0]))]
    assert caught, f"{name}: no set tells it apart"
    if name == "max started at 0":
        assert caught == [NEGATED.name]  # mixed rows still have a positive maximum: the negated set is needed


def test_a_variant_changes_nothing_it_does_not_name() -> None:
    x = _rand(32, 32)
    plain = Variant(name="nothing")
    assert torch.equal(vary([x], 1, plain)[0], x)
