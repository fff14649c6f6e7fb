"""bench/scale_bench.py's reading of its runs: throughput, busy share, the ratio against 0.85 x N, and
verdicts compared with faster and slower as one (the runs themselves: docs/benchmarks.md, and
tests/campaign/test_cluster_gpu.py on GPUs)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from scale_bench import Run, report, summary  # noqa: E402

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


def test_compile_only_figures_are_never_called_a_gpu_result() -> None:
    one = _run("one", 1, 10.0, 9.0, {"a": "needs_gpu"})
    many = _run("many", 2, 6.0, 10.0, {"a": "needs_gpu"})
    s = summary(one, many, OVERHEAD, compile_only=True)
    assert s["met"] is None
    text = report(one, many, s)
    assert "no GPU: the path's figures, not GPUs'" in text and "not a GPU figure" in text
