"""Precision probes on CPU (`harness.worker.probes`, `harness.judgment.probing`): the probe inputs, the error
comparison against a float64 reference, and the rule, on candidates that simulate TF32, bf16, 3xTF32
and BF16x9 arithmetic in torch (products of rounded operands accumulated in float32, or chunk by
chunk as a tensor core's accumulator does), at the reduction length of the GPU fixtures (K = 1024)
and at K = 16384; and the float64 arbitration of an input set failed by a rounding-sized margin."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

from kb_mcp.harness.judgment.probing import (
    ARBITER,
    PLAIN_RATIO,
    PROBE_BOUND,
    PROBES,
    PrecisionCheck,
    ProbeError,
    error_ratio,
    judged,
)
from kb_mcp.harness.worker.probes import (
    against_float64,
    float64_reference,
    mixed_magnitudes,
    probe_inputs,
    run_probes,
)
from kb_mcp.harness.worker.values import LOWERED_PRECISION_ERR, compare
from kb_mcp.kb.models import Track

TF32_CHECK = PrecisionCheck(track=Track.fp32, kernels={"gemm": ["tf32"]})

# -- simulated arithmetic --------------------------------------------------------------------------


def tf32(x: torch.Tensor) -> torch.Tensor:
    """x rounded to TF32 (10 mantissa bits, ties away from zero: `cvt.rna.tf32.f32`)."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32)


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def split(x: torch.Tensor, parts: int, rounding: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
    """x as a sum of `parts` values in the rounded format: hi = r(x), lo = r(x - hi), ..."""
    out, rest = [], x
    for _ in range(parts):
        out.append(rounding(rest))
        rest = rest - out[-1]
    return out


def products(xs: list[torch.Tensor], ws: list[torch.Tensor], pairs: list[tuple[int, int]]) -> torch.Tensor:
    """The sum of xs[i] @ ws[j].T over `pairs`, smallest terms first, each product accumulated in float32."""
    y = torch.zeros(xs[0].shape[0], ws[0].shape[0])
    for i, j in sorted(pairs, key=lambda p: -(p[0] + p[1])):
        y = y + xs[i] @ ws[j].T
    return y


def scheme_matmul(scheme: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if scheme == "fp32_split_k":  # honest float32, another order than the reference's: two halves of K
        h = x.shape[1] // 2
        return x[:, :h] @ w[:, :h].T + x[:, h:] @ w[:, h:].T
    if scheme == "fp32_sequential":  # honest float32 FMAs along K, one accumulator (a naive SIMT kernel)
        y, xd, wd = torch.zeros(x.shape[0], w.shape[0]), x.double(), w.double()
        for k in range(x.shape[1]):
            y = (y.double() + xd[:, k:k + 1] * wd[:, k][None, :]).float()
        return y
    if scheme == "tf32":
        return tf32(x) @ tf32(w).T
    if scheme == "bf16":
        return bf16(x) @ bf16(w).T
    if scheme == "3xtf32":
        return products(split(x, 2, tf32), split(w, 2, tf32), [(1, 0), (0, 1), (0, 0)])
    if scheme == "bf16x9":
        return products(split(x, 3, bf16), split(w, 3, bf16), [(i, j) for i in range(3) for j in range(3)])
    raise ValueError(scheme)


def round_toward_zero(v: torch.Tensor) -> torch.Tensor:
    """float64 -> float32, rounded toward zero (the pessimistic model of a tensor core's adder)."""
    r = v.float()
    return torch.where(r.double().abs() > v.abs(), torch.nextafter(r, torch.zeros_like(r)), r)


def tensor_core_3xtf32(x: torch.Tensor, w: torch.Tensor, fresh_every: int | None) -> torch.Tensor:
    """3xTF32 as mma instructions issue it: per 8-wide K chunk three products (small terms first),
    each added to the accumulator and truncated to float32. `fresh_every`: the accumulator restarts
    at zero every that many K and is added to a float32 total (None: one accumulator over all K)."""
    xs, ws = split(x, 2, tf32), split(w, 2, tf32)
    total = torch.zeros(x.shape[0], w.shape[0])
    acc = torch.zeros_like(total)
    for k in range(0, x.shape[1], 8):
        if fresh_every is not None and k % fresh_every == 0:
            total, acc = total + acc, torch.zeros_like(acc)
        for i, j in ((1, 0), (0, 1), (0, 0)):
            acc = round_toward_zero(acc.double() + xs[i][:, k:k + 8].double() @ ws[j][:, k:k + 8].double().T)
    return total + acc


class LinearOffset(nn.Module):
    """The GPU fixtures' problem (tests/harness/fixtures/linear_offset_problem.py): Linear + an offset."""

    def __init__(self, k: int, n: int, offset: float = 64.0) -> None:
        super().__init__()
        self.linear = nn.Linear(k, n)
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.offset


class Simulated(nn.Module):
    """A candidate for LinearOffset computing its matmul with `matmul(x, w)`, reading the reference's parameters."""

    def __init__(self, ref: LinearOffset, matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.ref, self.matmul = ref, matmul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.ref.linear.weight) + self.ref.linear.bias + self.ref.offset


def probed(ref: nn.Module, cand: nn.Module, make: Callable[[], list[torch.Tensor]],
           check: PrecisionCheck = TF32_CHECK) -> PrecisionCheck:
    return run_probes(check, ref, make, lambda args, _ref_out: cand(*args))


def linear(m: int, k: int, n: int, offset: float = 64.0) -> tuple[LinearOffset, Callable[[], list[torch.Tensor]]]:
    torch.manual_seed(0)
    ref = LinearOffset(k, n, offset)
    return ref, lambda: [torch.randn(m, k)]


def ratios(check: PrecisionCheck) -> dict[str, float]:
    return {p.probe: p.ratio for p in check.probes if p.ratio is not None}


# -- probe inputs ----------------------------------------------------------------------------------


def test_low_bits_values_keep_their_information_below_tf32_and_bf16() -> None:
    x = torch.randn(4096) * 3.0
    [probe] = probe_inputs("low_bits", [x], seed=1)
    assert probe.dtype == torch.float32 and probe.shape == x.shape
    assert torch.equal(torch.sign(probe), torch.where(x < 0, -1.0, 1.0))  # signs kept
    d = probe.abs() / 4.0 - 1  # ±2^e(1 + d), 2^e the power of two nearest the RMS (3 -> 4)
    assert bool((d > 0).all()) and float(d.max()) < 2.0**-11 and float(d.min()) >= 2.0**-20
    # TF32 and bf16 round every value to the power of two; float32 holds them, and they differ
    assert torch.equal(tf32(probe).abs(), torch.full_like(probe, 4.0))
    assert torch.equal(bf16(probe).abs(), torch.full_like(probe, 4.0))
    assert probe.abs().unique().numel() > 200


def test_mixed_magnitudes_and_same_sign_inputs() -> None:
    x = torch.randn(8192)
    [mixed] = probe_inputs("mixed_magnitudes", [x], seed=2)
    factor = (mixed / x).log2()
    assert torch.equal(factor, factor.round()) and int(factor.min()) == -8 and int(factor.max()) == 8
    [positive] = probe_inputs("same_sign", [x], seed=2)
    assert torch.equal(positive, x.abs())


def test_only_floating_tensors_are_rewritten_and_the_seed_decides() -> None:
    x, index, mask = torch.randn(64), torch.arange(64), torch.rand(64) > 0.5
    own = probe_inputs("own", [x, index, mask, 3], seed=5)
    assert own[0] is x and own[1] is index and own[2] is mask and own[3] == 3
    for probe in PROBES[1:]:
        out = probe_inputs(probe, [x, index, mask, 3], seed=5)
        assert out[1] is index and out[2] is mask and out[3] == 3 and not torch.equal(out[0], x)
    assert torch.equal(mixed_magnitudes(x, torch.Generator().manual_seed(9)),
                       mixed_magnitudes(x, torch.Generator().manual_seed(9)))
    assert not torch.equal(probe_inputs("low_bits", [x], 5)[0], probe_inputs("low_bits", [x], 6)[0])


def test_the_float64_reference_is_a_copy() -> None:
    ref = LinearOffset(8, 4)
    exact = float64_reference(ref)
    assert exact.linear.weight.dtype == torch.float64 and ref.linear.weight.dtype == torch.float32
    assert torch.equal(exact.linear.weight.float(), ref.linear.weight)


# -- the rule --------------------------------------------------------------------------------------


def test_error_ratio_takes_the_worse_of_rms_and_max_over_floored_reference_errors() -> None:
    assert error_ratio(2.0, 1.0, 1.0, 1.0, 0.0, 0.0) == 2.0
    assert error_ratio(1.0, 6.0, 1.0, 2.0, 0.0, 0.0) == 3.0
    assert error_ratio(1.0, 1.0, 0.0, 0.0, 0.5, 0.25) == 4.0  # an exact reference is raised to the floor
    assert error_ratio(0.0, 0.0, 0.0, 0.0, 0.0, 0.0) == 0.0
    assert math.isinf(error_ratio(1.0, math.inf, 1.0, 1.0, 0.0, 0.0))
    assert math.isinf(error_ratio(math.nan, 1.0, 1.0, 1.0, 0.0, 0.0))


def _probe(name: str, ratio: float | None, ref_err: float = 1e-6) -> ProbeError:
    return ProbeError(probe=name, ratio=ratio, reference_rms=ref_err, reference_max=ref_err,
                      note="" if ratio is not None else "skipped")


def test_the_rule_passes_fails_or_cannot_judge() -> None:
    ok = judged(TF32_CHECK, [_probe("own", 1.2), _probe("low_bits", PROBE_BOUND), _probe("same_sign", None)])
    assert ok.status == "passed" and ok.worst is not None and ok.worst.probe == "low_bits"
    assert "3xTF32" in ok.scheme() and "error-compensated" in ok.scheme()
    assert "same_sign (skipped)" in ok.evidence() and "own 1.2x" in ok.evidence()
    plain = judged(TF32_CHECK, [_probe("own", 1.5), _probe("mixed_magnitudes", 900.0)])
    assert plain.status == "failed" and plain.scheme().startswith("plain TF32") and "mixed_magnitudes" in plain.scheme()
    partial = judged(TF32_CHECK, [_probe("own", PROBE_BOUND * 1.5)])
    assert partial.status == "failed" and "partial compensation" in partial.scheme()
    assert PROBE_BOUND * 1.5 < PLAIN_RATIO
    none = judged(TF32_CHECK, [_probe("own", None)])
    assert none.status == "unjudged" and none.note == "no probe could run"
    blind = judged(TF32_CHECK, [_probe("own", 300.0, ref_err=0.0)])
    assert blind.status == "unjudged" and "fixes the dtype" in blind.note


# -- the whole probe run on simulated candidates --------------------------------------------------


@pytest.mark.parametrize("offset", [64.0, 0.0])
def test_the_probes_separate_the_schemes_at_the_fixtures_k(offset: float) -> None:
    """32 rows of the fixtures' 512 and 128 of their 1024 columns (the errors are per element), their K = 1024."""
    ref, make = linear(32, 1024, 128, offset)
    found = {}
    for scheme in ("fp32_split_k", "3xtf32", "bf16x9", "tf32", "bf16"):
        cand = Simulated(ref, lambda x, w, s=scheme: scheme_matmul(s, x, w))
        found[scheme] = probed(ref, cand, make)
        assert len(ratios(found[scheme])) == len(PROBES), found[scheme].probes
    for scheme in ("fp32_split_k", "3xtf32", "bf16x9"):
        assert found[scheme].status == "passed", (scheme, ratios(found[scheme]))
        assert max(ratios(found[scheme]).values()) <= PROBE_BOUND / 4, (scheme, ratios(found[scheme]))
    # plain TF32 and bf16 fail by a wide margin on their worst probe, and on every probe here
    for scheme, every, worst in (("tf32", 2, 16), ("bf16", 16, 100)):
        check = found[scheme]
        assert check.status == "failed" and check.scheme().startswith("plain"), ratios(check)
        assert min(ratios(check).values()) >= every * PROBE_BOUND, (scheme, ratios(check))
        assert max(ratios(check).values()) >= worst * PROBE_BOUND, (scheme, ratios(check))


@pytest.mark.slow
def test_the_probes_separate_the_schemes_at_a_long_k() -> None:
    ref, make = linear(16, 16384, 64, offset=0.0)
    # Honest float32 in one sequence errs many times the blocked reference here: why the bound is not 4.
    sequential = ratios(probed(ref, Simulated(ref, lambda x, w: scheme_matmul("fp32_sequential", x, w)), make))
    assert 4.0 < max(sequential.values()) <= PROBE_BOUND, sequential
    for scheme, passes in (("3xtf32", True), ("bf16x9", True), ("fp32_split_k", True), ("tf32", False),
                           ("bf16", False)):
        check = probed(ref, Simulated(ref, lambda x, w, s=scheme: scheme_matmul(s, x, w)), make)
        worst = max(ratios(check).values())
        if passes:
            assert check.status == "passed" and worst <= PROBE_BOUND / 2, (scheme, ratios(check))
        else:
            assert check.status == "failed" and worst >= 16 * PROBE_BOUND, (scheme, ratios(check))


@pytest.mark.slow
def test_a_truncating_accumulator_needs_fresh_k_tiles_at_a_long_k() -> None:
    """If the tensor core's adder truncates (rounds toward zero), 3xTF32 chained through one
    accumulator over K = 16384 drifts far from float32's accuracy; restarting the accumulator every
    K-tile (here 32) and adding the tiles in float32 keeps it there. The seed lesson says so."""
    ref, make = linear(16, 16384, 16, offset=0.0)
    chained = probed(ref, Simulated(ref, lambda x, w: tensor_core_3xtf32(x, w, None)), make)
    fresh = probed(ref, Simulated(ref, lambda x, w: tensor_core_3xtf32(x, w, 32)), make)
    assert chained.status == "failed" and max(ratios(chained).values()) > 4 * PROBE_BOUND, ratios(chained)
    assert fresh.status == "passed" and max(ratios(fresh).values()) <= PROBE_BOUND / 2, ratios(fresh)


# -- what the probes cannot judge ------------------------------------------------------------------


class FixedDtype(LinearOffset):
    """A reference whose forward casts to float32: its float64 copy computes in float32 too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x.float(), self.linear.weight.float(), self.linear.bias.float()) + self.offset


class Float32Only(LinearOffset):
    """A reference whose forward fails in float64 (a float32 constant meets float64 inputs)."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__(k, n)
        self.scale = torch.ones(k, n)  # a plain attribute: .double() leaves it float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.scale + self.offset


def test_a_reference_that_hides_float64_leaves_the_probes_unjudged() -> None:
    torch.manual_seed(0)
    fixed = FixedDtype(256, 32)
    tf32_cand = Simulated(fixed, lambda x, w: scheme_matmul("tf32", x, w))
    check = probed(fixed, tf32_cand, lambda: [torch.randn(16, 256)])
    assert check.status == "unjudged" and "fixes the dtype" in check.note
    broken = Float32Only(64, 8)
    check = probed(broken, lambda x: x @ broken.scale + 64.0, lambda: [torch.randn(4, 64)])
    assert check.status == "unjudged" and check.note == "no probe could run"
    assert all("the float64 reference failed: RuntimeError" in p.note for p in check.probes)


def test_a_candidate_that_is_not_finite_on_a_probe_fails_it() -> None:
    ref, make = linear(8, 64, 16)
    def overflowing(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x @ w.T
        return torch.where(x.abs().max() > 100, y * torch.inf, y)  # wrong only for large inputs

    check = probed(ref, Simulated(ref, overflowing), make)
    assert check.status == "failed" and math.isinf(ratios(check)["mixed_magnitudes"]), ratios(check)
    assert ratios(check)["own"] <= PROBE_BOUND
    assert "output is not finite" in check.scheme() and "mixed_magnitudes (the inputs scaled" in check.scheme()
    # the evidence travels as JSON (worker to server, tool results): an infinite ratio stays one
    again = PrecisionCheck.model_validate_json(check.model_dump_json())
    assert math.isinf(ratios(again)["mixed_magnitudes"]) and again == check


def test_the_strict_reference_runs_with_tf32_off_on_every_track_and_the_candidate_in_its_tracks() -> None:
    from kb_mcp.harness.worker.tracks import set_numerics, strict_numerics

    seen: list[tuple[str, torch.dtype, bool]] = []

    class Watched(LinearOffset):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(("reference", x.dtype, torch.backends.cuda.matmul.allow_tf32))
            return super().forward(x)

    torch.manual_seed(0)
    ref = Watched(64, 8)

    def candidate(args: list[torch.Tensor], _ref_out: object) -> torch.Tensor:
        seen.append(("candidate", args[0].dtype, torch.backends.cuda.matmul.allow_tf32))
        return ref.linear(args[0]) + 64.0

    set_numerics(Track.tf32)
    try:
        check = run_probes(PrecisionCheck(track=Track.tf32, kernels={"k": ["bf16"]}), ref,
                           lambda: [torch.randn(4, 64)], candidate, numerics=lambda: strict_numerics(Track.tf32))
    finally:
        set_numerics(Track.fp32)
    assert check.status == "passed", check.probes
    strict = [tf32 for who, dtype, tf32 in seen if who == "reference" and dtype == torch.float32]
    tracked = [tf32 for who, _, tf32 in seen if who == "candidate"]
    assert len(strict) == len(tracked) == len(PROBES) and not any(strict) and all(tracked)
    assert sum(dtype == torch.float64 for _, dtype, _ in seen) == len(PROBES)  # one float64 run per probe


# -- the float64 arbitration of a failed input set (`probes.against_float64`) -------------------------


class SequentialDotRelu(nn.Module):
    """relu(x . w - c), the dot product summed one term at a time in the input's dtype: in float32 a
    long sum of large positive terms carries the reference's own rounding (as a GEMM over K = 8192
    with stretched inputs does), and the subtraction leaves outputs small beside that rounding."""

    def __init__(self, k: int, c: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(k, generator=torch.Generator().manual_seed(3)))
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acc = torch.zeros(x.shape[0], dtype=x.dtype)
        for j in range(x.shape[1]):
            acc = acc + x[:, j] * self.w[j]
        return torch.relu(acc - self.c)


def _arbitration_case() -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model, its inputs, the float32 reference's output and the exact output rounded to float32."""
    k = 2048
    x = torch.rand(4096, k, generator=torch.Generator().manual_seed(5)) * 24.0
    model = SequentialDotRelu(k, c=0.0)
    with torch.no_grad():
        model.c = float(model(x).median())  # about half the outputs cancel to small values, half are 0
        strict = model(x)
        exact = float64_reference(model)(x.double()).float()
    return model, x, strict, exact


def test_a_candidate_more_accurate_than_the_reference_fails_the_tolerance_but_passes_against_float64() -> None:
    model, x, strict, exact = _arbitration_case()
    plain = compare(exact, strict, 1e-4, 1e-4)
    assert not plain.passed and plain.scaled is not None and plain.scaled <= LOWERED_PRECISION_ERR, plain
    with torch.no_grad():
        found = against_float64(model, [x], [exact], [strict])
    assert found.probe == ARBITER and found.ratio is not None and found.ratio <= 1.0, found
    assert found.candidate_max is not None and found.reference_max is not None
    assert found.candidate_max < found.reference_max  # the reference's own rounding is the difference


def _tf32_case() -> tuple[nn.Linear, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(model, input, its float32 output, the same product as plain TF32 would give): K = 4096
    terms of large values, where TF32's 10-bit mantissa errs well beyond the reference's rounding."""
    k = 4096
    a = torch.randn(256, k, generator=torch.Generator().manual_seed(7)) * 8.0
    model = nn.Linear(k, 512, bias=False)
    with torch.no_grad():
        return model, a, model(a), (tf32(a).double() @ tf32(model.weight).double().T).float()


def test_plain_tf32_and_a_dropped_term_fail_against_float64() -> None:
    model, a, strict, plain_tf32 = _tf32_case()
    with torch.no_grad():
        w = model.weight
        dropped = (a[:, :-1].double() @ w[:, :-1].double().T).float()  # one of K terms left out
        tf32_found = against_float64(model, [a], [plain_tf32], [strict])
        dropped_found = against_float64(model, [a], [dropped], [strict])
    assert tf32_found.ratio is not None and tf32_found.ratio > PROBE_BOUND, tf32_found
    assert dropped_found.ratio is not None and dropped_found.ratio > PROBE_BOUND, dropped_found


def test_a_float64_copy_that_cannot_run_leaves_the_failure_standing() -> None:
    class Float32Only(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.dtype != torch.float32:
                raise TypeError("float32 only")
            return x * 2.0

    x = torch.rand(64)
    found = against_float64(Float32Only(), [x], [x * 2.0], [x * 2.0])
    assert found.ratio is None and "float64 reference failed" in found.note, found
