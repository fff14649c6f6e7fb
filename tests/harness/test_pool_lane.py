"""The pool and the GPU lane: a baseline a worker measured is cached only from a verification that
held the GPU alone (the machine-wide lane); otherwise the result says it was not, and why.

A GPU worker cannot run here, so its reply (a verdict and a measured baseline) is built as the
worker sends it, and handed to the pool's own step that keeps baselines; the GPU test of two
processes (test_lane_gpu.py) sees the same step through real verifications.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kb_mcp.harness.baselines import Baseline, BaselineCache
from kb_mcp.harness.gpu import lane
from kb_mcp.harness.gpu.gpu_key import ENV_LANE_KEY
from kb_mcp.harness.gpu.lane_file import ENV_LANE_DIR
from kb_mcp.harness.judgment.verdict import CompileResult, Timings, VerifyResult
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import Problem
from kb_mcp.harness.protocol import VerifyReply, WorkerInfo
from kb_mcp.kb.models import Verdict

INFO = WorkerInfo(pid=1, cuda=True, device="NVIDIA H100 80GB HBM3", arch="sm_90", torch_version="2.13.0")


def _reply(problem: Problem) -> VerifyReply:
    timings = Timings(candidate_ms=1.0, candidate_min_ms=0.9, candidate_host_ms=1.1, runs=100, eager_ms=2.0,
                      speedup_vs_eager=2.0, speedup_vs_baseline=2.0)
    result = VerifyResult(candidate_id="c_0123456789abcdef", problem=problem.name, problem_hash=problem.hash,
                          verdict=Verdict.faster, summary="faster", compile=CompileResult(ok=True), timings=timings)
    # the worker's own names for the key are ignored: the pool stores under the key it knows
    measured = Baseline(problem_hash="named-by-worker", device="named-by-worker", torch_version="0", eager_ms=2.0,
                        eager_runs=100)
    return VerifyReply(result=result, baseline=measured)


@pytest.fixture
def pool(tmp_path: Path) -> WorkerPool:
    made = WorkerPool(cache_dir=tmp_path / "cache")  # starts no worker
    yield made
    made.close()


def _cached(pool: WorkerPool, problem: Problem) -> Baseline | None:
    return BaselineCache(pool.cache_dir).get(problem.hash, INFO.device, INFO.torch_version, need_compile=False)


def test_a_baseline_measured_holding_the_gpu_alone_is_cached(
        pool: WorkerPool, relu_problem: Problem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_LANE_KEY, "test-pool-lane")
    monkeypatch.setenv(ENV_LANE_DIR, str(tmp_path / "lanes"))
    with lane.hold("verify relu") as held:
        assert held.alone
        result = pool._keep_baseline(_reply(relu_problem), SimpleNamespace(info=INFO), relu_problem, "fp32")
    assert result.timings is not None and result.timings.baseline_not_cached == ""
    cached = _cached(pool, relu_problem)
    assert cached is not None and cached.eager_ms == 2.0 and cached.device == INFO.device


@pytest.mark.parametrize("how", ["process lane only", "no lane"])
def test_a_baseline_measured_without_the_gpu_to_itself_is_not_cached_and_the_result_says_why(
        how: str, pool: WorkerPool, relu_problem: Problem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_LANE_KEY, "test-pool-lane")
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv(ENV_LANE_DIR, str(tmp_path / "not-a-folder"))  # the machine-wide lane is unusable
    if how == "no lane":
        result = pool._keep_baseline(_reply(relu_problem), SimpleNamespace(info=INFO), relu_problem, "fp32")
        why = "the GPU lane was not held"
    else:
        with lane.hold("verify relu") as held:
            assert not held.alone
            result = pool._keep_baseline(_reply(relu_problem), SimpleNamespace(info=INFO), relu_problem, "fp32")
        why = "not-a-folder"
    assert result.timings is not None
    note = result.timings.baseline_not_cached
    assert note.startswith("the baseline measured in this run was not cached: it did not hold the GPU alone (")
    assert why in note
    assert _cached(pool, relu_problem) is None
