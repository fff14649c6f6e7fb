"""What keeps the timing process clean, on CPU: the guard census that must be empty before a timed
series, the garbage collector paused around it, and the profiler refused in timing workers; and when
a series may stop because its median is known well enough (`RunStats.precise`)."""

from __future__ import annotations

import dataclasses
import gc
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kb_mcp.harness.worker import integrity_runtime as rt
from kb_mcp.harness.worker import profiling
from kb_mcp.harness.worker.timing import (
    PRECISE_MIN_RUNS,
    PRECISION,
    HostEvent,
    RunStats,
    Series,
    Timer,
    guards_active,
    host_trusted,
    median_interval,
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
