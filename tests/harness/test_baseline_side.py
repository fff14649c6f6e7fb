"""Which worker times a problem's baselines (`harness.pool.baseline_side`): never one a candidate ran in.

Real worker processes (compile-only ones, so the same on any machine); a worker that served a
candidate is marked as the pool marks it when it sends one a verification.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.harness.pool.pool import WorkerPool

pytestmark = pytest.mark.slow


def test_a_worker_that_served_no_candidate_times_the_baselines_itself(tmp_path: Path) -> None:
    with WorkerPool(tmp_path, no_cuda=True, spare=True) as pool:
        active = pool._ready()
        assert pool._candidate_free() is active


def test_after_a_candidate_the_spare_times_them_and_the_active_worker_stays(tmp_path: Path) -> None:
    with WorkerPool(tmp_path, no_cuda=True, spare=True) as pool:
        active = pool._ready()
        active.served += 1  # as `_request` does when it sends a verification
        chosen = pool._candidate_free()
        assert chosen is not active and chosen is pool._spare and not chosen.served
        assert pool._worker is active and active.alive()  # the candidates' worker goes on serving them
        assert pool.restarts == 0


def test_without_a_spare_a_fresh_worker_takes_the_place_of_the_one_a_candidate_ran_in(tmp_path: Path) -> None:
    with WorkerPool(tmp_path, no_cuda=True, spare=False) as pool:
        used = pool._ready()
        used.served += 1
        fresh = pool._candidate_free()
        assert fresh is not used and not fresh.served and pool._worker is fresh
        assert used not in pool._all


def test_a_retired_spare_is_replaced_by_a_new_spare_not_by_the_active_worker(tmp_path: Path) -> None:
    with WorkerPool(tmp_path, no_cuda=True, spare=True) as pool:
        active = pool._ready()
        active.served += 1
        spare = pool._candidate_free()
        pool._retire(spare)
        assert pool._worker is active and active.alive()
        assert pool._spare is not None and pool._spare is not spare and spare not in pool._all
        assert pool.restarts == 1


def test_a_pool_without_a_gpu_says_so_for_the_baselines_and_where_the_time_went(tmp_path: Path, relu_problem) -> None:
    with WorkerPool(tmp_path, no_cuda=True, spare=False) as pool:
        run = pool.baselines(relu_problem)
    assert run.status == "needs_gpu" and "GPU" in run.note
    assert list(run.phases) == ["lane", "worker_start", "request", "worker_restart"], run.phases
    assert sum(run.phases.values()) == pytest.approx(run.elapsed_s, abs=0.05)


def _result(cached: bool):
    from kb_mcp.harness.judgment.verdict import CompileResult, Timings, VerifyResult
    from kb_mcp.kb.models import Verdict

    return VerifyResult(candidate_id="c", problem="p", problem_hash="h", verdict=Verdict.faster, summary="s",
                        compile=CompileResult(ok=True), timings=Timings(
                            candidate_ms=1.0, candidate_min_ms=1.0, candidate_host_ms=1.0, runs=10, eager_ms=2.0,
                            baseline_cached=cached))


def test_a_verdict_whose_baselines_the_pool_timed_first_says_they_were_not_cached_yet() -> None:
    from kb_mcp.harness.baselines import Baseline, BaselineRun
    from kb_mcp.harness.pool.pool import _with_first_baselines

    base = Baseline(problem_hash="h", device="d", torch_version="t", eager_ms=2.0, eager_runs=10)
    timed = BaselineRun(problem="p", problem_hash="h", status="ok", baseline=base)
    # the worker judged it against the pool's figures as against cached ones; the verdict tells the truth
    got = _with_first_baselines(_result(cached=True), timed)
    assert got.timings is not None and not got.timings.baseline_cached and got.timings.baseline_not_cached == ""
    beside = timed.model_copy(update={"note": "the baseline measured in this run was not cached: ..."})
    got = _with_first_baselines(_result(cached=True), beside)
    assert got.timings is not None and got.timings.baseline_not_cached.startswith("the baseline measured")
    from_cache = timed.model_copy(update={"cached": True})
    assert _with_first_baselines(_result(cached=True), from_cache).timings.baseline_cached  # type: ignore[union-attr]
    failed = BaselineRun(problem="p", problem_hash="h", status="problem_error", note="its forward raised")
    assert _with_first_baselines(_result(cached=False), failed).timings.baseline_not_cached == ""  # type: ignore[union-attr]
    assert _with_first_baselines(_result(cached=True), None).timings.baseline_cached  # type: ignore[union-attr]


# A problem that switches torch.compile off at import, in a form the static rules do not read.
COMPILE_OFF_PROBLEM = '''
import importlib
import torch
import torch.nn as nn

importlib.import_module("torch." + "_dyn" + "amo").config.patch(disable=True).__enter__()


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0 + 1.0


def get_inputs():
    return [torch.randn(1 << 20)]


def get_init_inputs():
    return []
'''


@pytest.mark.gpu
def test_a_problem_that_changes_torch_compiles_settings_gets_no_compile_figure_and_a_new_worker(
        tmp_path: Path, relu_problem) -> None:
    from kb_mcp.harness.problem import parse_problem
    from kb_mcp.harness.worker.baseline_run import COMPILER_SETTINGS_CHANGED

    with WorkerPool(tmp_path) as pool:
        run = pool.baselines(parse_problem(COMPILE_OFF_PROBLEM, "compile_off"))
        assert run.status == "ok" and run.baseline is not None, run.note
        assert run.baseline.compile_ms is None and run.baseline.compile_note == COMPILER_SETTINGS_CHANGED
        assert run.worker_retired  # the next problem is not timed with its settings
        clean = pool.baselines(relu_problem)
        assert clean.status == "ok" and clean.baseline is not None and clean.baseline.compile_ms, clean
        assert not clean.worker_retired
