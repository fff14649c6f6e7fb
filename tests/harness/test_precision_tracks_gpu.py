"""Precision tracks on a real GPU: tensor-core candidates below their track's precision (their SASS)
judged by the precision probes (plain TF32 and bf16 fail them with the evidence, 3xTF32 on mma.sync
and on wgmma passes), and the strict track's reference and baselines timed with TF32 off (as the
worker reports it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness_helpers import FIXTURES, fixture_source

from kb_mcp.harness.baselines import BaselineCache
from kb_mcp.harness.judgment.probing import PROBE_BOUND, PROBES, PrecisionCheck
from kb_mcp.harness.judgment.verdict import FindingCode, VerifyOptions, VerifyResult
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import load_problem
from kb_mcp.kb.models import Track, Verdict

pytestmark = pytest.mark.gpu

VALID = (Verdict.faster, Verdict.slower)
STRICT_NUMERICS = {"matmul.allow_tf32": False, "cudnn.allow_tf32": False, "float32_matmul_precision": "highest"}
TF32_NUMERICS = {"matmul.allow_tf32": True, "cudnn.allow_tf32": True, "float32_matmul_precision": "high"}

# A plain fp32 SIMT kernel for the same problem: correct in the strict track, so its baselines get timed.
FP32_LINEAR = '''
import torch
import torch.nn as nn

SRC = r"""
extern "C" __global__ void linear_fp32(const float* x, const float* w, const float* b, float* y,
                                       int M, int N, int K, double offset) {  // Python float: a double
    const int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc = fmaf(x[m * K + k], w[n * K + k], acc);
    y[m * N + n] = acc + b[n] + (float)offset;
}
"""


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.k = torch.cuda._compile_kernel(SRC, "linear_fp32")

    def forward(self, x):
        m, k = x.shape
        n = self.linear.weight.shape[0]
        y = torch.empty(m, n, device=x.device, dtype=x.dtype)
        self.k(grid=((n + 127) // 128, m, 1), block=(128, 1, 1),
               args=[x, self.linear.weight, self.linear.bias, y, m, n, k, 64.0])
        return y
'''


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory):
    with WorkerPool(tmp_path_factory.mktemp("tracks-cache")) as p:
        yield p


@pytest.fixture(scope="module")
def linear_offset():
    return load_problem(str(FIXTURES / "linear_offset_problem.py"))


def _quick(track: Track) -> VerifyOptions:
    return VerifyOptions(timing=False, compile_baseline=False, track=track)


@pytest.fixture(scope="module")
def linear_offset_loose():
    return load_problem(str(FIXTURES / "linear_offset_loose_problem.py"))


def _probed(result: VerifyResult, status: str) -> PrecisionCheck:
    """The result's precision check, every probe run, with `status`."""
    check = result.precision
    assert check is not None and check.status == status, (result.summary, check)
    assert [p.probe for p in check.probes] == list(PROBES) and all(p.ran for p in check.probes), check.probes
    return check


def _lowered_by_probes(result: VerifyResult, kind: str, margin: float) -> None:
    """`incorrect (precision_lowered)` from the probes: plain `kind` arithmetic, its worst error at
    least `margin` times the bound, the SASS and the probes' numbers in the finding."""
    assert result.verdict == Verdict.incorrect, result.summary
    assert result.summary.startswith("incorrect (precision_lowered): "), result.summary
    check = _probed(result, "failed")
    worst = check.worst
    assert worst is not None and worst.ratio is not None and worst.ratio >= margin * PROBE_BOUND, check.probes
    assert check.scheme().startswith(f"plain {kind}"), check.scheme()
    [finding] = [f for f in result.findings if f.code == FindingCode.precision_lowered]
    assert "(their SASS)" in finding.message and f"plain {kind}" in finding.message and "own " in finding.message


@pytest.mark.parametrize("fixture", ["linear_mma_tf32.py", "linear_wgmma_tf32.py"])
def test_a_tf32_candidate_is_lowered_in_fp32_by_its_probes_and_passes_in_tf32(pool: WorkerPool, linear_offset,
                                                                              fixture: str) -> None:
    source = fixture_source(fixture)
    strict = pool.verify(linear_offset, source, _quick(Track.fp32))
    assert strict.track == Track.fp32
    # its outputs pass the strict tolerance here (the offset loosens the scale): the SASS asks, the probes show it
    assert all(s.passed for s in strict.input_sets), strict.summary
    _lowered_by_probes(strict, "TF32", margin=8)
    tf32 = pool.verify(linear_offset, source, _quick(Track.tf32))
    assert tf32.verdict in VALID and tf32.findings == [] and tf32.precision is None, tf32.summary
    assert tf32.track == Track.tf32 and tf32.tolerance == {"atol": 1e-2, "rtol": 1e-2}
    assert tf32.record(_quick(Track.tf32)).track == Track.tf32


def test_a_bf16_candidate_passes_in_bf16_and_is_lowered_in_fp32_and_tf32(pool: WorkerPool, linear_offset) -> None:
    source = fixture_source("linear_mma_bf16.py")
    bf16 = pool.verify(linear_offset, source, _quick(Track.bf16))
    assert bf16.verdict in VALID and bf16.findings == [] and bf16.precision is None, bf16.summary
    for track in (Track.fp32, Track.tf32):
        # on this problem its errors fail the stretched inputs already (the checks say precision_lowered)
        lowered = pool.verify(linear_offset, source, _quick(track))
        assert lowered.verdict == Verdict.incorrect, lowered.summary
        assert any(f.code == FindingCode.precision_lowered for f in lowered.findings), lowered.findings


def test_a_bf16_candidate_within_the_tolerance_is_lowered_by_its_probes(pool: WorkerPool,
                                                                        linear_offset_loose) -> None:
    source = fixture_source("linear_mma_bf16.py")
    for track in (Track.fp32, Track.tf32):  # the probes hold every track to the strict reference's accuracy
        lowered = pool.verify(linear_offset_loose, source, _quick(track))
        assert all(s.passed for s in lowered.input_sets), lowered.summary
        _lowered_by_probes(lowered, "BF16", margin=40)


@pytest.mark.parametrize("fixture", ["linear_mma_3xtf32.py", "linear_wgmma_3xtf32.py"])
def test_a_3xtf32_candidate_passes_the_probes_in_fp32(pool: WorkerPool, linear_offset, fixture: str) -> None:
    result = pool.verify(linear_offset, fixture_source(fixture), _quick(Track.fp32))
    assert result.verdict in VALID and result.findings == [], result.summary
    check = _probed(result, "passed")
    assert check.precisions == ["tf32"] and len(check.kernels) == 1, check.kernels
    worst = check.worst
    assert worst is not None and worst.ratio is not None and worst.ratio <= PROBE_BOUND / 2, check.probes
    assert "precision: TF32 tensor-core instructions with an error at the strict reference's level" in result.summary
    assert "3xTF32" in result.summary and "mixed_magnitudes " in result.summary


def test_strict_baselines_are_timed_with_tf32_off_and_tf32_ones_with_it_on(pool: WorkerPool, tmp_path: Path) -> None:
    # A GEMM large enough that TF32 shows in eager's time (2048^3: ~17 GFLOP).
    text = (FIXTURES / "linear_offset_problem.py").read_text()
    text = text.replace("batch_size = 512", "batch_size = 2048").replace("in_features = 1024", "in_features = 2048")
    text = text.replace("out_features = 1024", "out_features = 2048")
    path = tmp_path / "linear_offset_2048.py"
    path.write_text(text)
    problem = load_problem(str(path))
    strict = pool.verify(problem, FP32_LINEAR, VerifyOptions())
    assert strict.verdict in VALID and strict.findings == [], strict.summary
    tf32 = pool.verify(problem, fixture_source("linear_mma_tf32.py"), VerifyOptions(track=Track.tf32))
    assert tf32.verdict in VALID and tf32.findings == [], tf32.summary
    cache = BaselineCache(pool.cache_dir)
    info = pool.state()
    device, torch_version = strict.device, strict.torch_version
    fp32_base = cache.get(problem.hash, device, torch_version, need_compile=True, track="fp32")
    tf32_base = cache.get(problem.hash, device, torch_version, need_compile=True, track="tf32")
    assert fp32_base is not None and tf32_base is not None, info
    assert fp32_base.numerics == STRICT_NUMERICS and tf32_base.numerics == TF32_NUMERICS
    assert strict.timings is not None and tf32.timings is not None
    assert strict.timings.eager_ms == pytest.approx(fp32_base.eager_ms)
    # the flags took effect: eager's GEMM on TF32 tensor cores is clearly faster than in fp32
    assert tf32_base.eager_ms < 0.8 * fp32_base.eager_ms, (tf32_base, fp32_base)
