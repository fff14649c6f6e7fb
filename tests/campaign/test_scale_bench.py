"""bench/scale_bench.py's reading of its runs: throughput, busy share, the ratio against 0.85 x N, and
verdicts compared with faster and slower as one (the runs themselves: docs/benchmarks.md, and
tests/campaign/test_cluster_gpu.py on GPUs)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from scale_bench import Run, Task, phase_means, report, summary  # noqa: E402

OVERHEAD = {"tasks": 10, "ms_per_task_one_at_a_time": 9.5, "tasks_per_s_all_slots": 150.0, "slots": 2}


def _run(name: str, gpus: int, wall: float, busy: float, verdicts: dict[str, str | None]) -> Run:
    return Run(name=name, gpus=gpus, start_s=1.0, wall_s=wall, verified=len(verdicts), busy_s=busy,
               devices=["H200"] * gpus, verdicts=verdicts)


def test_the_ratio_is_throughput_over_throughput_against_085_n() -> None:
    one = _run("one", 1, 100.0, 90.0, {"a": "faster", "b": "slower", "c": "incorrect", "d": "faster"})
    fast = _run("many", 2, 55.0, 99.0, {"a": "slower", "b": "faster", "c": "incorrect", "d": "faster"})
    s = summary(one, fast, OVERHEAD, compile_only=False)
    assert s["ratio"] == round(100 / 55, 3) and s["target"] == 1.7 and s["met"] is True
    assert s["one"]["busy_share"] == 0.9 and s["many"]["busy_share"] == round(99 / 110, 3)
    assert s["verdicts_differ"] == []  # faster and slower are one kind
    slow = _run("many", 2, 60.0, 99.0, {"a": "faster", "b": "faster", "c": "crashed", "d": "faster"})
    s = summary(one, slow, OVERHEAD, compile_only=False)
    assert s["met"] is False and s["verdicts_differ"] == ["c"]
    text = report(one, slow, s)
    assert "(target >= 1.70: NOT met)" in text and "verdicts agree: NO (c)" in text
    assert "9.5 ms per task one at a time, 150 tasks/s with 2 slots" in text


def test_the_lane_held_and_the_gpu_busy_are_two_figures_beside_the_verifying_share() -> None:
    one = _run("one", 1, 100.0, 90.0, {"a": "faster"}).model_copy(update={"lane_s": 60.0, "gpu_busy": 0.21})
    many = _run("many", 2, 50.0, 90.0, {"a": "faster"}).model_copy(update={"lane_s": 80.0})
    s = summary(one, many, OVERHEAD, compile_only=False)
    assert (s["one"]["busy_share"], s["one"]["lane_share"], s["one"]["gpu_busy"]) == (0.9, 0.6, 0.21)
    assert (s["many"]["lane_share"], s["many"]["gpu_busy"]) == (0.8, None)
    text = report(one, many, s)
    assert "verifying 90%, lane 60%, GPU busy 21%" in text and "lane 80%, GPU busy -" in text


def test_compile_only_figures_are_never_called_a_gpu_result() -> None:
    one = _run("one", 1, 10.0, 9.0, {"a": "needs_gpu"})
    many = _run("many", 2, 6.0, 10.0, {"a": "needs_gpu"})
    s = summary(one, many, OVERHEAD, compile_only=True)
    assert s["met"] is None
    text = report(one, many, s)
    assert "no GPU: the path's figures, not GPUs'" in text and "not a GPU figure" in text


def test_copies_are_lowered_to_fit_the_budget_and_never_below_one() -> None:
    from scale_bench import fit_copies

    # a set of 20 s probed: one GPU 20 s a copy, two GPUs 10 s, stretched 1.2: 36 s a copy
    assert fit_copies(4, 20.0, 2, 400.0) == 4
    assert fit_copies(4, 20.0, 2, 100.0) == 2
    assert fit_copies(4, 20.0, 2, 10.0) == 1
    assert fit_copies(3, 0.0, 2, 10.0) == 3  # nothing measured (compile-only, warm): as asked


def test_the_timeline_shows_each_worker_busy_where_its_tasks_ran() -> None:
    from scale_bench import Task, timeline_text

    run = _run("many", 2, 10.0, 9.0, {"a": "faster", "b": "slower"}).model_copy(update={"tasks": [
        Task(problem="1_a_c0", worker="gpu-0", start_s=0.0, end_s=5.0),
        Task(problem="2_b_c0", worker="gpu-1", start_s=5.0, end_s=10.0)]})
    text = timeline_text(run, width=10)
    assert "gpu-0    |#####.....|" in text and "gpu-1    |.....#####|" in text
    assert "    0.0 -     5.0 s  gpu-0    1_a_c0" in text


@pytest.mark.slow
@pytest.mark.nvcc
def test_the_bench_runs_end_to_end_on_cpu_workers(tmp_path: Path) -> None:
    """Compile-only checks on two CPU workers: the set copied, warmed, probed, measured on both paths."""
    import scale_bench

    env = dict(os.environ)
    try:
        assert scale_bench.main(["--compile-only", "--problems", "swish,row_sum", "--copies", "3", "--echo", "5",
                                 "--one-worker", "--out", str(tmp_path)]) == 0
    finally:
        os.environ.clear()
        os.environ.update(env)  # the bench points KB_MCP_CACHE at its own cache
    out = json.loads((tmp_path / "scale.json").read_text())
    s, many, one = out["summary"], out["runs"]["many"], out["runs"]["one"]
    assert s["copies"] == 3 and s["met"] is None and s["verdicts_differ"] == []
    assert sorted(s["problems"]) == ["row_sum", "swish"]
    assert len(many["tasks"]) == len(one["tasks"]) == 6 == many["verified"]
    assert {t["worker"] for t in many["tasks"]} == {"cpu-0", "cpu-1"} and set(s["many"]["by_worker"]) == {"cpu-0",
                                                                                                          "cpu-1"}
    assert all(t["worker"] == "local" for t in one["tasks"])
    lone = out["runs"]["one-worker"]  # the diagnosis: the same set on a cluster of the first worker alone
    assert {t["worker"] for t in lone["tasks"]} == {"cpu-0"} and lone["verified"] == 6
    assert s["path"] == round(s["one_worker"]["per_minute"] / s["one"]["per_minute"], 3)
    assert set(many["verdicts"]) == {f"{n}_{p}_c{k}" for n, (p, k) in enumerate(
        [(p, k) for p in s["problems"] for k in range(3)], 1)}


def test_the_mean_seconds_per_phase_show_where_a_verification_grew() -> None:
    run = _run("many", 2, 10.0, 9.0, {"a": "faster", "b": "slower"})
    run.tasks = [Task(problem="a", worker="gpu-0", start_s=0.0, end_s=4.0, phases_s={"check": 3.0, "timing": 1.0}),
                 Task(problem="b", worker="gpu-1", start_s=0.0, end_s=2.0, phases_s={"check": 1.0, "static": 0.5}),
                 Task(problem="c", worker="gpu-1", start_s=2.0, end_s=3.0)]  # no verdict: not counted
    assert phase_means(run) == {"check": 2.0, "timing": 0.5, "static": 0.25}
    assert phase_means(run, top=1) == {"check": 2.0}
    one = _run("one", 1, 20.0, 19.0, {"a": "faster", "b": "slower"})
    s = summary(one, run, OVERHEAD, compile_only=False)
    assert "mean s per verification: check 2.00, timing 0.50, static 0.25" in report(one, run, s)


def test_the_diagnosis_splits_the_paths_cost_from_the_hosts_sharing() -> None:
    one = _run("one", 1, 60.0, 58.0, {"a": "faster", "b": "slower"})
    lone = _run("one-worker", 1, 75.0, 70.0, {"a": "faster", "b": "slower"})  # the Dask path: 0.8x today's
    many = _run("many", 2, 50.0, 90.0, {"a": "faster", "b": "slower"})  # 2 workers: 1.5 of 2 x one worker
    s = summary(one, many, OVERHEAD, compile_only=False, lone=lone)
    assert s["path"] == 0.8 and s["sharing"] == 0.75 and s["ratio"] == 1.2
    text = report(one, many, s, lone)
    assert "one worker of the cluster / one GPU 0.80 (the path's own cost)" in text
    assert "2 workers / 2 x one worker 0.75 (sharing the host)" in text
    assert [line.split()[0] for line in text.splitlines() if "worker(s): wall" in line] == ["one", "one-worker", "many"]
    assert "path" not in summary(one, many, OVERHEAD, compile_only=False)  # only with the diagnosis run
