"""Output comparison and tolerances (plain torch on the CPU; the same code runs on GPU tensors)."""

from __future__ import annotations

import pytest
import torch

from kb_mcp.harness.baselines import PROTOCOL, Baseline, BaselineCache
from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.worker import values
from kb_mcp.harness.worker.roofline import dram_bandwidth, peak_flops, roofline_ms
from kb_mcp.harness.worker.values import DEFAULT_TOLERANCES, POISON_BYTE, compare, leaves, tolerance_for


def test_float32_tolerance_is_relative_to_the_outputs_scale() -> None:
    torch.manual_seed(0)
    r = torch.randn(1000) * 1000.0  # scale ~1000: atol 1e-4 means 0.1 absolute here
    assert compare(r + 0.05, r, 1e-4, 0.0).passed
    bad = compare(r + 0.5, r, 1e-4, 0.0)
    assert not bad.passed and bad.mismatched == 1000 and bad.max_abs == pytest.approx(0.5, rel=1e-3)
    assert bad.scaled == pytest.approx(0.5 / float(r.pow(2).mean().sqrt()), rel=1e-3)


def test_nan_and_inf_never_pass_even_with_huge_tolerances() -> None:
    r = torch.ones(10)
    c = r.clone()
    c[3] = float("nan")
    c[4] = float("inf")
    out = compare(c, r, 1e9, 1e9)
    assert not out.passed and out.nonfinite == 2 and "NaN/Inf" in out.message


def test_poison_bytes_are_counted_as_never_written() -> None:
    r = torch.randn(64)
    c = r.clone()
    c.view(torch.uint8)[: 4 * 5] = POISON_BYTE  # five float32 elements never written
    out = compare(c, r, 1e-4, 1e-4)
    assert not out.passed and out.poison == 5 and "poison" in out.message
    canonical_nan = torch.full((4,), float("nan"))  # a NaN a kernel computes is not poison
    assert compare(canonical_nan, torch.ones(4), 1e-4, 1e-4).poison == 0


def test_constant_output_is_recognised_only_where_the_reference_varies() -> None:
    r = torch.randn(100)
    assert compare(torch.zeros(100), r, 1e-4, 1e-4).constant
    assert not compare(torch.zeros(100), torch.zeros(100), 1e-4, 1e-4).constant


@pytest.mark.parametrize("case", ["close", "off_by_a_little", "nan", "inf_in_reference", "poisoned", "bf16"])
def test_the_timed_recheck_decides_exactly_as_the_full_comparison(case: str) -> None:
    """`detail=False` (timed outputs) must pass and fail the same outputs; failures keep their detail."""
    torch.manual_seed(1)
    r = torch.randn(4096) * 3.0
    c = r + 1e-5 * torch.randn(4096)
    if case == "off_by_a_little":
        c[7] += 0.01
    elif case == "nan":
        c[9] = float("nan")
    elif case == "inf_in_reference":
        r[5] = float("inf")
        c[5] = float("inf")
    elif case == "poisoned":
        c.view(torch.uint8)[:8] = POISON_BYTE
    elif case == "bf16":
        r, c = r.bfloat16(), (c + 0.001).bfloat16()
    atol, rtol = (2e-2, 2e-2) if case == "bf16" else (1e-4, 1e-4)
    full = compare(c, r, atol, rtol)
    quick = compare(c, r, atol, rtol, detail=False)
    assert quick.passed == full.passed
    assert full.passed == (case in ("close", "bf16"))
    if not full.passed:
        assert quick == full  # a failing output gets every statistic and the same message


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_chunked_scale_of_finite_values_is_their_rms(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-kernel-per-chunk path (every value finite) gives the RMS the masked path gives."""
    torch.manual_seed(4)
    r = (torch.randn(5000) * 7.0).to(dtype)
    monkeypatch.setattr(values, "CHUNK_ELEMENTS", 1000)
    bad = compare(r + 1.0, r, 1e-4, 0.0)
    assert bad.scaled == pytest.approx(bad.max_abs / float(r.double().pow(2).mean().sqrt()), rel=1e-9)


def test_chunked_scale_is_the_rms_of_the_finite_values(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(3)
    r = torch.randn(5000) * 7.0
    r[123], r[4567] = float("nan"), float("-inf")
    finite = r[torch.isfinite(r)].double()
    monkeypatch.setattr(values, "CHUNK_ELEMENTS", 1000)
    bad = compare(r + 1.0, r, 1e-4, 0.0)
    assert bad.scaled == pytest.approx(bad.max_abs / float(finite.pow(2).mean().sqrt()), rel=1e-9)


_SPECIALS = [float("nan"), float("inf"), float("-inf"), 3.0e38, -3.0e38]


def _candidates(r: torch.Tensor, scale: float, atol: float, rtol: float, seed: int) -> list[torch.Tensor]:
    """Outputs to re-check against `r`: its copy, every value within half its tolerance (both ways),
    one value four tolerances off (both ways), one NaN, Inf or overflowing value."""
    gen = torch.Generator().manual_seed(seed)
    tol = atol * scale + rtol * r.double().abs()
    i = int(torch.randint(0, r.numel(), (1,), generator=gen))
    out = [r.clone(), (r.double() + 0.5 * tol).to(r.dtype), (r.double() - 0.5 * tol).to(r.dtype)]
    for off in (4.0, -4.0):
        c = r.double().clone()
        c[i] += off * float(tol[i])
        out.append(c.to(r.dtype))
    for special in _SPECIALS:
        c = r.clone()
        c[i] = special
        out.append(c)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tolerances", [(1e-4, 1e-4), (1e-2, 0.0), (0.0, 1e-3), (0.0, 0.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_the_lean_recheck_of_a_finite_reference_decides_as_the_general_one(
        seed: int, tolerances: tuple[float, float], dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where every reference value is finite, the re-check without its own finiteness test fails
    exactly the outputs the general one fails: NaN, Inf and overflowing values of the candidate,
    values outside the tolerance either way, and passes those inside it, over several chunks."""
    gen = torch.Generator().manual_seed(seed)
    r = (torch.randn(3000, generator=gen) * 5.0).to(dtype)
    monkeypatch.setattr(values, "CHUNK_ELEMENTS", 1000)
    atol, rtol = tolerances
    work = torch.float64 if dtype == torch.float64 else torch.float32
    scale, finite = values._scale(r.to(work))
    assert finite
    decided = []
    for cand in _candidates(r, scale, atol, rtol, seed):
        general = values._any_mismatch(cand, r, work, atol, rtol, scale)
        lean = values._any_mismatch(cand, r, work, atol, rtol, scale, finite_reference=True)
        assert lean == general
        decided.append(lean)
    assert decided[0] is False and all(decided[-len(_SPECIALS):])
    if dtype != torch.float16 and atol + rtol:  # offsets of a tolerance are representable here
        assert decided[1:5] == [False, False, True, True]


def test_a_reference_with_a_non_finite_value_is_never_re_checked_the_lean_way() -> None:
    r = torch.randn(100)
    r[3] = float("inf")
    c = r.clone()
    c[3] = float("-inf")  # within an infinite tolerance, yet not finite: it must fail
    scale, finite = values._scale(r)
    assert not finite
    assert values._any_mismatch(c, r, torch.float32, 1e-4, 1e-4, scale)
    assert not compare(c, r, 1e-4, 1e-4, detail=False).passed


def test_integers_must_match_exactly() -> None:
    r = torch.arange(10)
    assert compare(r.clone(), r, 1.0, 1.0).passed
    c = r.clone()
    c[0] = 1
    assert not compare(c, r, 1.0, 1.0).passed


def test_tolerances_come_from_dtype_problem_and_options_and_loosening_is_noted() -> None:
    opts = VerifyOptions()
    assert tolerance_for(torch.float32, None, None, opts) == (*DEFAULT_TOLERANCES["float32"], "")
    assert tolerance_for(torch.bfloat16, None, None, opts)[:2] == DEFAULT_TOLERANCES["bfloat16"]
    assert tolerance_for(torch.float32, 1e-3, 2e-3, opts) == (1e-3, 2e-3, "")  # the problem's own constants
    atol, rtol, note = tolerance_for(torch.float32, None, None, VerifyOptions(atol=1e-2))
    assert (atol, rtol) == (1e-2, 1e-4) and "loosened" in note
    assert tolerance_for(torch.float32, None, None, VerifyOptions(atol=1e-6, rtol=1e-6))[2] == ""  # tighter is fine


def test_leaves_accept_tensors_and_tuples_only() -> None:
    t = torch.zeros(2)
    assert leaves(t) == [t] and leaves((t, t)) == [t, t]
    assert leaves([t, 3]) is None and leaves({"a": t}) is None


def test_roofline_and_peaks() -> None:
    class Props:
        memory_clock_rate = 2_619_000  # kHz, as torch reports for an H100 SXM
        memory_bus_width = 5120

    bw = dram_bandwidth(Props())
    assert bw == pytest.approx(3.35e12, rel=0.01)
    assert dram_bandwidth(object()) is None
    assert peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989e12
    assert peak_flops("Some Other GPU", torch.float32) is None
    # 256 MiB through DRAM dominates a tiny FLOP count; a big GEMM is bound by FLOPs instead
    assert roofline_ms(256 << 20, 1e6, bw, 495e12) == pytest.approx((256 << 20) / bw * 1e3)
    assert roofline_ms(3 * 4096 * 4096 * 4, 2 * 4096**3, bw, 495e12) == pytest.approx(2 * 4096**3 / 495e12 * 1e3)
    assert roofline_ms(100, 0.0, None, None) is None


def test_baseline_cache_round_trip_and_staleness(tmp_path) -> None:
    cache = BaselineCache(tmp_path)
    assert cache.get("h", "GPU", "2.11", need_compile=False) is None
    cache.put(Baseline(problem_hash="h", device="NVIDIA H100 80GB HBM3", torch_version="2.11.0+cu130", eager_ms=1.0,
                       eager_runs=50))
    got = cache.get("h", "NVIDIA H100 80GB HBM3", "2.11.0+cu130", need_compile=False)
    assert got is not None and got.eager_ms == 1.0 and got.measured_at
    # asked for a torch.compile time that was never measured: measure again
    assert cache.get("h", "NVIDIA H100 80GB HBM3", "2.11.0+cu130", need_compile=True) is None
    # another GPU or torch version is another key
    assert cache.get("h", "NVIDIA H200", "2.11.0+cu130", need_compile=False) is None
    path = cache.path("h", "NVIDIA H100 80GB HBM3", "2.11.0+cu130")
    path.write_text(path.read_text().replace(f'"protocol": {PROTOCOL}', '"protocol": -1'))
    assert cache.get("h", "NVIDIA H100 80GB HBM3", "2.11.0+cu130", need_compile=False) is None


def test_only_finite_written_floating_outputs_off_by_little_are_rounding_sized() -> None:
    from kb_mcp.harness.worker.values import LOWERED_PRECISION_ERR, rounding_sized

    r = torch.linspace(-1.0, 1.0, 1000)
    small = compare(r + 1e-3 * r.pow(2).mean().sqrt(), r, 1e-4, 1e-4)  # off by 1e-3 of the RMS
    assert not small.passed and rounding_sized([small], [r])
    assert rounding_sized([compare(r, r, 1e-4, 1e-4)], [r])  # nothing failed: nothing to explain
    large = compare(r + 2 * LOWERED_PRECISION_ERR, r, 1e-4, 1e-4)
    assert not large.passed and not rounding_sized([large], [r])
    nan = r.clone()
    nan[3] = float("nan")
    assert not rounding_sized([compare(nan, r, 1e-4, 1e-4)], [r])
    half = r.half()
    assert not rounding_sized([compare(half + 1e-2, half, 1e-4, 1e-4)], [half])  # a float16 output is its own track
