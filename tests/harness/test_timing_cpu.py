"""What keeps the timing process clean, on CPU: the guard census that must be empty before a timed
series, the garbage collector paused around it, and the profiler refused in timing workers; and when
a series may stop because its median is known well enough (`RunStats.precise`) or its verdict is
(`RunStats.decided`)."""

from __future__ import annotations

import dataclasses
import gc
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kb_mcp.harness.baselines import Baseline
from kb_mcp.harness.worker import integrity_runtime as rt
from kb_mcp.harness.worker import profiling
from kb_mcp.harness.worker.run_stats import PRECISE_MIN_RUNS, PRECISION, RunStats, median_interval
from kb_mcp.harness.worker.timing import (
    HostEvent,
    Series,
    Timer,
    guards_active,
    host_trusted,
    paused_gc,
    time_with_reference,
)


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_a_clean_process_has_no_guards_and_each_kind_is_named() -> None:
    assert guards_active() == []
    with _Passthrough():
        assert guards_active() == ["1 dispatch mode(s)"]
    with torch.device("cpu"):  # a function mode
        assert guards_active() == ["1 function mode(s)"]
    previous = sys.gettrace()
    sys.settrace(lambda *a: None)
    try:
        assert "a trace function (sys.settrace)" in guards_active()
    finally:
        sys.settrace(previous)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert "the autograd profiler" in guards_active()
    assert guards_active() == []


def test_the_collector_is_paused_only_inside_and_restored_after() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()


def test_a_timing_process_refuses_profiler_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    before = rt.profiler_sessions()
    rt.profile_events(lambda: torch.ones(4).sum())
    assert rt.profiler_sessions() == before + 1
    monkeypatch.setitem(profiling._PROFILER_STATE, "forbidden", True)
    with pytest.raises(rt.ProfilerForbidden, match="census worker"):
        rt.profile_events(lambda: torch.ones(4).sum())
    assert rt.profiler_sessions() == before + 1


# -- when a series knows its median well enough -------------------------------------------------


def _scripted_timer(times_ms: list[float]) -> Timer:
    """A host-path Timer whose event spans are `times_ms` in turn (then the last, again and again)."""
    left = iter(times_ms)
    last = [times_ms[-1]]

    def elapsed(start: HostEvent, end: HostEvent) -> float:
        last[0] = next(left, last[0])
        return last[0]

    return Timer(dataclasses.replace(host_trusted(), event_elapsed_time=elapsed), lambda: None)


def test_the_median_interval_takes_the_sign_test_ranks() -> None:
    xs = [float(x) for x in range(100, 0, -1)]  # unsorted on purpose
    assert median_interval(xs[:20]) == (85.0, 96.0)  # ranks 5 and 16 of 81..100
    assert median_interval(xs) == (40.0, 61.0)  # ranks 40 and 61 of 1..100
    assert median_interval([3.0]) == (3.0, 3.0)
    assert median_interval([2.0, 1.0]) == (1.0, 2.0)


def test_a_median_is_precise_only_after_enough_runs_and_within_its_precision() -> None:
    steady = RunStats(gpu_ms=[1.0] * PRECISE_MIN_RUNS)
    assert steady.precise(0.01)
    assert not RunStats(gpu_ms=[1.0] * (PRECISE_MIN_RUNS - 1)).precise(0.01)
    spread = RunStats(gpu_ms=[1.0 + 0.01 * i for i in range(PRECISE_MIN_RUNS)])  # interval 1.04..1.15
    assert not spread.precise(0.01) and spread.precise(0.06)


def test_a_steady_series_stops_once_its_median_is_precise() -> None:
    checked: list[int] = []
    stats = _scripted_timer([0.5]).series(lambda i: i, lambda i: [i], 100, 1,
                                          check=lambda i, out: checked.append(i), precision=PRECISION)
    assert len(stats.gpu_ms) == PRECISE_MIN_RUNS and checked == list(range(PRECISE_MIN_RUNS))


def test_a_noisy_series_runs_on_until_its_median_is_precise_or_its_runs_are_done() -> None:
    noisy = [0.5, 0.7, 0.4, 0.9, 0.6] * 40  # never within 1 %
    assert len(_scripted_timer(noisy).series(lambda i: i, lambda i: [i], 60, 0, precision=PRECISION).gpu_ms) == 60
    # Noise first, then steady runs: it stops once the steady runs carry the interval.
    settling = [0.5, 0.7, 0.4, 0.9, 0.6] * 4 + [0.5] * 80
    got = _scripted_timer(settling).series(lambda i: i, lambda i: [i], 100, 0, precision=PRECISION)
    assert PRECISE_MIN_RUNS < len(got.gpu_ms) < 100
    lo, hi = median_interval(got.gpu_ms)
    assert hi - lo <= 2 * PRECISION * got.median_ms


def test_without_a_precision_every_run_asked_for_is_made() -> None:
    assert len(_scripted_timer([0.5]).series(lambda i: i, lambda i: [i], 40, 0).gpu_ms) == 40


def test_interleaved_series_stop_early_only_when_both_are_precise() -> None:
    a = Series(lambda i: i, lambda i: [i], runs=100, warmup=0, precision=PRECISION)
    b = Series(lambda i: i, lambda i: [i], runs=100, warmup=0, precision=PRECISION)
    sa, sb = _scripted_timer([0.5]).interleaved(a, b)
    assert len(sa.gpu_ms) == len(sb.gpu_ms) == PRECISE_MIN_RUNS
    # One series without a precision: both make every run asked for.
    c = Series(lambda i: i, lambda i: [i], runs=30, warmup=0)
    sa, sc = _scripted_timer([0.5]).interleaved(dataclasses.replace(a, runs=30), c)
    assert len(sa.gpu_ms) == len(sc.gpu_ms) == 30


def test_the_reference_series_timed_beside_a_candidate_takes_the_candidates_precision() -> None:
    cand = Series(lambda i: i, lambda i: [i], runs=100, warmup=1, precision=PRECISION)
    alone, eager = time_with_reference(_scripted_timer([0.5]), cand, lambda i: i, lambda i: [i], None, quick=False)
    assert eager is not None and len(alone.gpu_ms) == len(eager.gpu_ms) == PRECISE_MIN_RUNS
    fixed = dataclasses.replace(cand, precision=None)
    alone, eager = time_with_reference(_scripted_timer([0.5]), fixed, lambda i: i, lambda i: [i], None, quick=False)
    assert eager is not None and len(alone.gpu_ms) == len(eager.gpu_ms) == 100


# Twenty runs spread over 1.000-1.045 ms (each value twice): the 95 % interval of the median is
# 1.010-1.035, wider than +-1 %; the 99 % interval 1.005-1.040 is within +-3 % of the 1.0225 median.
SPREAD = [1.0 + 0.005 * (i % 10) for i in range(PRECISE_MIN_RUNS)]


def _baseline(eager_ms: float, compile_ms: float | None = None, issue_ms: float = 0.0) -> Baseline:
    return Baseline(problem_hash="p", device="d", torch_version="t", eager_ms=eager_ms, eager_runs=20,
                    eager_issue_ms=issue_ms, compile_ms=compile_ms)


def test_a_verdict_is_decided_only_wholly_on_one_side_of_its_baseline_and_within_a_few_percent() -> None:
    stats = RunStats(gpu_ms=list(SPREAD))
    assert not stats.precise(PRECISION)
    assert stats.decided(0.9) and stats.decided(1.2)  # clearly faster than 1.2, clearly slower than 0.9
    assert not stats.decided(1.02) and not stats.decided(1.005)  # inside the 99 % interval: not yet
    assert not RunStats(gpu_ms=SPREAD[:-1]).decided(0.9)  # too few runs
    wide = RunStats(gpu_ms=[1.0 + 0.05 * (i % 10) for i in range(PRECISE_MIN_RUNS)])
    assert not wide.decided(0.5)  # on one side, but the median is not known within +-3 %


def test_a_series_stops_once_its_verdict_against_a_fixed_baseline_is_decided() -> None:
    def timed(decides_at: float | None) -> int:
        stats = _scripted_timer(SPREAD * 10).series(lambda i: i, lambda i: [i], 100, 0, precision=PRECISION,
                                                    decides_at=decides_at)
        return len(stats.gpu_ms)

    assert timed(0.9) == PRECISE_MIN_RUNS
    assert PRECISE_MIN_RUNS < timed(1.02) == timed(None) <= 100  # undecided: on until the median is precise


def test_only_a_cached_gpu_bound_baseline_lets_the_candidate_stop_at_its_verdict() -> None:
    cand = Series(lambda i: i, lambda i: [i], runs=100, warmup=0, precision=PRECISION, decides_at=0.9)
    alone, eager = time_with_reference(_scripted_timer(SPREAD * 10), cand, lambda i: i, lambda i: [i],
                                       _baseline(0.9), quick=False)
    assert eager is None and len(alone.gpu_ms) == PRECISE_MIN_RUNS
    # launch-bound: eager is re-timed beside the candidate, so there is no fixed time to decide against
    steady_eager = [t for v in SPREAD * 10 for t in (v, 0.9)]  # interleaved: the candidate's, then eager's
    paired, eager = time_with_reference(_scripted_timer(steady_eager), cand, lambda i: i, lambda i: [i],
                                        _baseline(0.9, issue_ms=0.8), quick=False)
    assert eager is not None and len(paired.gpu_ms) > PRECISE_MIN_RUNS
    # a first measurement times eager after the candidate: the same
    alone, eager = time_with_reference(_scripted_timer(SPREAD * 10), cand, lambda i: i, lambda i: [i], None,
                                       quick=False)
    assert eager is not None and len(alone.gpu_ms) > PRECISE_MIN_RUNS


def test_the_verdict_turns_at_the_better_of_the_baselines_wanted() -> None:
    assert _baseline(1.0, compile_ms=0.8).turns_at(want_compile=True) == 0.8
    assert _baseline(1.0, compile_ms=0.8).turns_at(want_compile=False) == 1.0
    assert _baseline(1.0, compile_ms=1.3).turns_at(want_compile=True) == 1.0
    assert _baseline(1.0).turns_at(want_compile=True) == 1.0
