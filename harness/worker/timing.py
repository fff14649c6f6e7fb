"""Timing a forward call honestly (worker side, GPU).

Each run: fresh inputs (generated outside the timed region, so no future input exists in memory
for a candidate to precompute), the reference output for them (for the re-check), an L2 flush
(writing a buffer twice the L2 size), a device-wide synchronize, then CUDA events around the call
on the current stream plus the host clock around events and a second device-wide synchronize.
The median of many runs is reported: as many as fit a budget, or fewer once the median is known
within +-1 % (`RunStats.precise`) or the series' wall budget has passed. The host clock is the
cross-check: work the candidate leaves on a side stream or in a thread finishes inside the second
synchronize but outside the events, so the host time exceeds the event time by more than this
process's own calibrated gap. The host clock is also read once the call has returned and its end
event is queued (before the synchronize): that *issue time* says how long the host took to launch
the call's work. When it is a large part of the event time, the GPU was waiting on the host (a
launch-bound call, `baselines.launch_bound`).

Two callables can be timed interleaved (`Timer.interleaved`): their runs alternate, spread evenly
(`interleave_order`), each run with its own flush and syncs, so that both series see the same
machine state. The harness times a launch-bound reference beside the candidate this way, because
host-bound timings move by up to 1.9x between processes and minutes (docs/benchmarks.md).

Only functions captured before any candidate was imported are used here (`Trusted`), so a
candidate that replaces `torch.cuda.Event.elapsed_time` or `time.perf_counter_ns` changes nothing.

The process that times must be as clean as a fresh PyTorch process: no profiler session ever
started in it (the kernel census runs in a census worker, `harness.census`), no dispatch mode,
trace function or other guard active during a timed series, and Python's cyclic garbage
collector paused during the series (as `timeit` does), so that a collection of the harness's
large heap is not charged to whichever call it happened to interrupt. `bench/timing_fidelity.py`
compares this timer in a worker with the same timer in a bare process.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from kb_mcp.harness.baselines import MAX_EAGER_DRIFT, Baseline, best_of, launch_bound
from kb_mcp.harness.judgment.kernels import DeviceTime
from kb_mcp.harness.judgment.verdict import Timings
from kb_mcp.harness.worker.integrity_runtime import Trusted
from kb_mcp.harness.worker.run_stats import PRECISION, RunStats

TARGET_TIMED_S = 0.4  # timed runs per candidate: as many as fit this budget, within [MIN_RUNS, MAX_RUNS]
MIN_RUNS = 10
MAX_RUNS = 100
QUICK_RUNS = 5
# Re-timing a cached launch-bound reference beside the candidate: as many runs as fit this much
# event time, within [MIN_RUNS, MAX_RUNS]. Its eager calls then cost about 0.1-0.2 s of a verdict.
RETIME_TIMED_S = 0.15
# A series stops after this much wall time once each of its callables has had MIN_RUNS timed runs:
# on an input of several GB, each run's fresh inputs and re-checked output cost tens of
# milliseconds around a call of a few, so a hundred runs took 7-14 s of a first verdict.
TIMED_WALL_S = 1.5
def stop_rules(asked: int | None) -> tuple[float | None, float | None]:
    """A series' (`wall_s`, `precision`): none where the caller asked for a number of runs (all are
    made), else the wall budget (`TIMED_WALL_S`) and the precision (`PRECISION`)."""
    return (None, None) if asked else (TIMED_WALL_S, PRECISION)


def least_runs(runs: int) -> int:
    """The runs a series with a wall budget makes before it may stop: MIN_RUNS, or all if fewer."""
    return min(runs, MIN_RUNS)


def retime_runs(eager_ms: float, quick: bool) -> int:
    """Runs of a cached launch-bound reference re-timed beside the candidate (`RETIME_TIMED_S`)."""
    if quick:
        return QUICK_RUNS
    return int(min(MAX_RUNS, max(MIN_RUNS, RETIME_TIMED_S * 1e3 / max(eager_ms, 1e-3))))


@dataclass
class Series:
    """One callable to time: `make_args(i)` makes fresh inputs for run i (i < 0: warm-up runs),
    `check(i, out)` returns an error text for a wrong output of run i (None: not checked)."""

    fn: Callable[..., Any]
    make_args: Callable[[int], Sequence[Any]]
    runs: int
    warmup: int
    check: Callable[[int, Any], str | None] | None = None
    wall_s: float | None = None  # stop after this much wall time, once MIN_RUNS (or `runs`) have run
    precision: float | None = None  # stop once the median is this precise (`RunStats.precise`)
    # With a precision, stop also once the verdict against this time is known (`RunStats.decided`):
    # the best baseline's, where it is fixed before the series (cached and GPU-bound)
    decides_at: float | None = None


def interleave_order(runs_a: int, runs_b: int) -> list[int]:
    """The order of two interleaved series: 0 for a run of the first, 1 for the second.

    Each series' runs sit at evenly spaced points of the same span (run i of n at (i + 0.5) / n),
    so equal counts alternate (A B A B ...) and unequal ones spread the rarer runs evenly between
    the others (A A B A A B ...); a tie puts the first series first.
    """
    slots = [((i + 0.5) / runs_a, 0) for i in range(runs_a)] + [((j + 0.5) / runs_b, 1) for j in range(runs_b)]
    return [which for _, which in sorted(slots)]


class HostEvent:
    """The host clock in the shape of `torch.cuda.Event`: the Timer's path without a GPU.

    Where no device runs the work, the call itself is the "event" span; the Timer's logic
    (interleaving, checks, issue and host times) is then the same on a CPU-only machine.
    """

    def __init__(self, enable_timing: bool = True) -> None:
        self.ns = 0

    def record(self, stream: Any = None) -> None:
        """Stamps the host clock."""
        self.ns = time.perf_counter_ns()

    def synchronize(self) -> None:
        """Nothing is pending on the host."""

    def elapsed_time(self, end: HostEvent) -> float:
        """Milliseconds from this stamp to `end`'s."""
        return (end.ns - self.ns) / 1e6


def host_trusted() -> Trusted:
    """Trusted functions for timing on the host clock (no GPU): see `HostEvent`."""
    return Trusted(
        perf_counter=time.perf_counter, perf_counter_ns=time.perf_counter_ns, monotonic=time.monotonic,
        synchronize=lambda *a: None, event_cls=HostEvent, event_record=HostEvent.record,
        event_synchronize=HostEvent.synchronize, event_elapsed_time=HostEvent.elapsed_time,
        current_stream=lambda *a: None, allclose=torch.allclose, isclose=torch.isclose, isfinite=torch.isfinite,
        equal=torch.equal,
    )


class L2Flusher:
    """Evicts the L2 cache by writing a buffer twice its size (a different value each time)."""

    def __init__(self, l2_bytes: int) -> None:
        n = max(2 * l2_bytes, 32 << 20) // 4
        self.buf = torch.empty(n, dtype=torch.int32, device="cuda")
        self.i = 0

    def __call__(self) -> None:
        self.i += 1
        self.buf.fill_(self.i)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Runs the block with the cyclic garbage collector collected once and then paused."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def guards_active() -> list[str]:
    """What would make timed calls slower than in a clean process: dispatch or function modes
    pushed, a trace or profile function set, the autograd profiler on. Empty when clean."""
    found: list[str] = []
    dispatch = int(torch._C._len_torch_dispatch_stack())
    function = int(torch._C._len_torch_function_stack())
    if dispatch:
        found.append(f"{dispatch} dispatch mode(s)")
    if function:
        found.append(f"{function} function mode(s)")
    if sys.gettrace() is not None:
        found.append("a trace function (sys.settrace)")
    if sys.getprofile() is not None:
        found.append("a profile function (sys.setprofile)")
    if getattr(torch.autograd.profiler, "_is_profiler_enabled", False):
        found.append("the autograd profiler")
    return found


class Timer:
    """Times callables with trusted events and clocks; see the module docstring."""

    def __init__(self, trusted: Trusted, flusher: Callable[[], None]) -> None:
        """`flusher` evicts the L2 cache before each run (`L2Flusher`; a no-op on the host path)."""
        self.t = trusted
        self.flush = flusher
        self.calibrated_gap_ms = 0.0

    @classmethod
    def on_host(cls) -> Timer:
        """A timer on the host clock, for machines without a GPU (see `HostEvent`)."""
        return cls(host_trusted(), lambda: None)

    def _one(self, fn: Callable[..., Any], args: Sequence[Any]) -> tuple[Any, float, float, float]:
        """One run: (output, event ms, host ms, issue ms)."""
        t = self.t
        start = t.event_cls(enable_timing=True)
        end = t.event_cls(enable_timing=True)
        self.flush()
        t.synchronize()
        h0 = t.perf_counter_ns()
        t.event_record(start)
        out = fn(*args)
        t.event_record(end)
        # After the end event is queued, so that this clock read is not inside the events.
        issued = t.perf_counter_ns()
        t.synchronize()
        h1 = t.perf_counter_ns()
        return out, float(t.event_elapsed_time(start, end)), (h1 - h0) / 1e6, (issued - h0) / 1e6

    def calibrate(self, runs: int = 20) -> float:
        """Host-minus-event gap of a one-kernel call: what this process's own overhead looks like."""
        x = torch.zeros(1024, device="cuda" if self.t.event_cls is not HostEvent else "cpu")
        gaps = []
        with paused_gc():
            for _ in range(runs):
                _, g, h, _ = self._one(lambda: x.add_(1.0), ())
                gaps.append(h - g)
        self.calibrated_gap_ms = statistics.median(gaps)
        return self.calibrated_gap_ms

    def runs_for(self, fn: Callable[..., Any], make_args: Callable[[int], Sequence[Any]], quick: bool,
                 requested: int | None) -> int:
        """How many timed runs: requested, quick, or as many as fit the budget after one probe run."""
        if requested:
            return requested
        if quick:
            return QUICK_RUNS
        fn(*make_args(-1))  # first calls may compile or autotune: not what one run costs
        _, g, h, _ = self._one(fn, make_args(-1))
        per = max(g, h, 1e-3) / 1e3
        return int(min(MAX_RUNS, max(MIN_RUNS, TARGET_TIMED_S / per)))

    def series(
        self,
        fn: Callable[..., Any],
        make_args: Callable[[int], Sequence[Any]],
        runs: int,
        warmup: int,
        check: Callable[[int, Any], str | None] | None = None,
        wall_s: float | None = None,
        precision: float | None = None,
        decides_at: float | None = None,
    ) -> RunStats:
        """`warmup` untimed runs, then `runs` timed ones; `make_args(i)` makes fresh inputs for run i
        (called outside the timed region); `check(i, out)` returns an error text for a wrong output;
        `wall_s`, `precision` and `decides_at` end the series early (`Series`). The caller makes sure that
        `guards_active()` is empty."""
        (stats,) = self._timed([Series(fn, make_args, runs, warmup, check, wall_s, precision, decides_at)], [0] * runs)
        return stats

    def interleaved(self, a: Series, b: Series) -> tuple[RunStats, RunStats]:
        """Both series' warm-ups, then their timed runs alternating in `interleave_order`, so that
        both see the same machine state (the same minute, the same process conditions)."""
        return self._timed([a, b], interleave_order(a.runs, b.runs))  # type: ignore[return-value]

    def _timed(self, series: list[Series], order: list[int]) -> list[RunStats]:
        """Warm-ups of every series, then one timed run of `series[k]` for each k in `order`, until
        the shortest `wall_s` of the series has passed and each has had its least runs
        (`least_runs`), or until every series has a `precision` and its median is that precise."""
        for s in series:
            for i in range(s.warmup):
                s.fn(*s.make_args(-1 - i))
        self.t.synchronize()
        stats = [RunStats() for _ in series]
        done = [0] * len(series)
        walls = [s.wall_s for s in series if s.wall_s is not None]
        stop_at = self.t.perf_counter_ns() + int(min(walls) * 1e9) if walls else None
        with paused_gc():
            for k in order:
                if stop_at is not None and self.t.perf_counter_ns() > stop_at and all(
                        n >= least_runs(s.runs) for n, s in zip(done, series)):
                    break
                if _settled(series, stats):
                    break
                s, st, i = series[k], stats[k], done[k]
                done[k] += 1
                args = s.make_args(i)
                out, g, h, issued = self._one(s.fn, args)
                st.gpu_ms.append(g)
                st.host_ms.append(h)
                st.issue_ms.append(issued)
                if s.check is not None:
                    err = s.check(i, out)
                    if err:
                        st.errors.append(f"run {i}: {err}")
                del out, args
        return stats

    def unsynchronized(self, stats: RunStats) -> str | None:
        """A message when host time exceeds event time by more than own overhead explains."""
        gap = stats.gap_ms
        allowed = self.calibrated_gap_ms + max(0.05, 0.25 * stats.median_ms)
        if gap > allowed:
            return (
                f"the host clock (median {stats.host_median_ms:.4f} ms, device-wide sync) exceeds the CUDA events "
                f"on the current stream (median {stats.median_ms:.4f} ms) by {gap:.4f} ms per call, more than this "
                f"process's own overhead ({self.calibrated_gap_ms:.4f} ms) explains: work ran outside the current "
                "stream (a side stream or thread the events miss). Launch everything on "
                "torch.cuda.current_stream() and finish it before forward returns"
            )
        return None


def _settled(series: list[Series], stats: list[RunStats]) -> bool:
    """Whether every series asks for a precision and its median already has it, or decides its verdict."""
    return all(s.precision is not None and (st.precise(s.precision) or (
        s.decides_at is not None and st.decided(s.decides_at))) for s, st in zip(series, stats))


def time_with_reference(
    timer: Timer, cand: Series, ref: Callable[..., Any], make_ref: Callable[[int], Sequence[Any]],
    cached: Baseline | None, quick: bool,
) -> tuple[RunStats, RunStats | None]:
    """The candidate's timed series, and the reference's eager series where eager is timed now.

    * cached, GPU-bound: the candidate alone; the cached eager figure stands (None). Only here may
      the series stop once its verdict is decided (`Series.decides_at`): the baseline is fixed.
    * cached, launch-bound: both interleaved (`retime_runs` eager runs), since the cached figure
      may come from a slower or faster minute than this one.
    * nothing cached (a first measurement): the candidate alone, then eager alone, exactly as a
      GPU-bound problem is timed on every later verdict; only if eager turns out launch-bound are
      both timed again interleaved, and that pair is returned (the candidate's timed-output errors
      of both rounds kept). Interleaving is kept to the problems whose timings drift with the host.
    """
    warm, wall, precision = cand.warmup, cand.wall_s, cand.precision
    if cached is not None and not cached.launch_bound:
        return timer.series(cand.fn, cand.make_args, cand.runs, warm, cand.check, wall, precision,
                            cand.decides_at), None
    cand = dataclasses.replace(cand, decides_at=None)  # eager is timed now: no fixed time to decide against
    if cached is not None:
        return timer.interleaved(cand, Series(ref, make_ref, retime_runs(cached.eager_ms, quick), warm, wall_s=wall,
                                              precision=precision))
    alone = timer.series(cand.fn, cand.make_args, cand.runs, warm, cand.check, wall, precision)
    eager_runs = QUICK_RUNS if quick else timer.runs_for(ref, make_ref, False, None)
    eager = timer.series(ref, make_ref, eager_runs, warm, wall_s=wall, precision=precision)
    if not launch_bound(eager.median_ms, eager.issue_median_ms):
        return alone, eager
    paired, eager = timer.interleaved(cand, Series(ref, make_ref, retime_runs(eager.median_ms, quick), warm,
                                                   wall_s=wall, precision=precision))
    paired.errors = alone.errors + paired.errors
    return paired, eager


def timings_against(
    candidate: RunStats,
    eager: RunStats | None,
    base: Baseline,
    cached: bool,
    *,
    want_compile: bool,
    quick: bool,
    bound_ms: float | None,
    device: DeviceTime | None = None,
    eager_device: DeviceTime | None = None,
) -> Timings:
    """The candidate's timings against its baselines, and the device times beside them.

    `eager` is the reference's series timed in this verdict (`time_with_reference`: interleaved
    with the candidate's where the reference is launch-bound), or None where the cached figure
    stands (a GPU-bound reference). With `cached` False the baseline was just measured from those
    very runs. With `cached` True eager was re-timed beside the
    candidate: its figure replaces the cached one, and the cached torch.compile figure is scaled by
    the same drift (a launch-bound reference's compiled call is host-bound as well, and compiling
    it again would cost seconds), unless the re-timed figure is slower than the cached one by more
    than `MAX_EAGER_DRIFT`: then the cached figures stand, and the note says so.

    `device` and `eager_device` are the device times the census worker measured (`DeviceTime`):
    the candidate's, and the reference's where it was measured in this verdict; else eager's comes
    from the baseline (`Baseline.eager_device_ms`). Unknown ones stay None, their note in `note`.
    """
    cand = candidate.median_ms
    eager_ms = base.eager_ms
    compile_ms = base.compile_ms if want_compile else None
    notes = [base.compile_note] if base.compile_note else []
    retimed = scaled = False
    cached_ms: float | None = None
    drift: float | None = None
    if eager is not None and not cached:
        retimed, eager_ms = True, eager.median_ms
    elif eager is not None:
        cached_ms, drift = base.eager_ms, eager.median_ms / base.eager_ms
        if drift <= MAX_EAGER_DRIFT:
            retimed, eager_ms = True, eager.median_ms
            note = (f"eager re-timed beside the candidate (a launch-bound reference's time moves with the host's "
                    f"speed): {eager_ms:.4g} ms, {drift:.2f}x its cached {cached_ms:.4g} ms")
            if compile_ms is not None:
                note += (f"; torch.compile's cached {compile_ms:.4g} ms scaled by the same {drift:.2f}x (its call is "
                         "host-bound too; it is not compiled again per candidate)")
                compile_ms, scaled = compile_ms * drift, True
            notes.append(note)
        else:
            notes.append(f"eager re-timed beside the candidate took {eager.median_ms:.4g} ms, {drift:.2f}x its cached "
                         f"{cached_ms:.4g} ms: more than the {MAX_EAGER_DRIFT:g}x a host's drift explains, so the "
                         "cached "
                         "figures are used (a reference slowed from inside the process must not make a speedup)")
    best = best_of(eager_ms, compile_ms)
    device_fields, device_notes = _device_fields(device, eager_device, base)
    notes += device_notes
    return Timings(
        candidate_ms=round(cand, 6), candidate_min_ms=round(candidate.min_ms, 6),
        candidate_host_ms=round(candidate.host_median_ms, 6), runs=len(candidate.gpu_ms),
        eager_ms=round(eager_ms, 6), compile_ms=None if compile_ms is None else round(compile_ms, 6),
        speedup_vs_eager=round(eager_ms / cand, 4),
        speedup_vs_compile=None if compile_ms is None else round(compile_ms / cand, 4),
        speedup_vs_baseline=round(best / cand, 4), baseline_cached=cached, quick=quick,
        bound_ms=None if bound_ms is None else round(bound_ms, 6), note="; ".join(notes),
        launch_bound=base.launch_bound, eager_retimed=retimed,
        eager_cached_ms=None if cached_ms is None else round(cached_ms, 6),
        eager_drift=None if drift is None else round(drift, 4), compile_scaled=scaled, **device_fields,
    )


def _device_fields(device: DeviceTime | None, eager_device: DeviceTime | None,
                   base: Baseline) -> tuple[dict[str, Any], list[str]]:
    """`Timings`' device-time fields, and notes on those left unknown."""
    notes: list[str] = []
    cand = device.ms if device is not None else None
    eager = eager_device.ms if eager_device is not None and eager_device.ms is not None else base.eager_device_ms
    if device is not None and cand is None:
        notes.append(f"device time unknown: {device.note}")
    if eager is None and eager_device is not None and eager_device.note:
        notes.append(f"eager's device time unknown: {eager_device.note}")
    fields = {
        "candidate_device_ms": cand, "candidate_kernels": device.kernels if cand is not None and device else None,
        "eager_device_ms": None if eager is None else round(eager, 6),
        "speedup_device_vs_eager": round(eager / cand, 4) if eager is not None and cand else None,
    }
    return fields, notes
