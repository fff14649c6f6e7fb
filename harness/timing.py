"""Timing a forward call honestly (worker side, GPU).

Each run: fresh inputs (generated outside the timed region, so no future input exists in memory
for a candidate to precompute), the reference output for them (for the re-check), an L2 flush
(writing a buffer twice the L2 size), a device-wide synchronize, then CUDA events around the call
on the current stream plus the host clock around events and a second device-wide synchronize.
The median of many runs is reported. The host clock is the cross-check: work the candidate leaves
on a side stream or in a thread finishes inside the second synchronize but outside the events, so
the host time exceeds the event time by more than this process's own calibrated gap.

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

import gc
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from kb_mcp.harness.integrity_runtime import Trusted

TARGET_TIMED_S = 0.4  # timed runs per candidate: as many as fit this budget, within [MIN_RUNS, MAX_RUNS]
MIN_RUNS = 10
MAX_RUNS = 100
QUICK_RUNS = 5


@dataclass
class RunStats:
    """Per-run times of one timed series (milliseconds)."""

    gpu_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # re-check failures of timed outputs

    @property
    def median_ms(self) -> float:
        """Median event time."""
        return statistics.median(self.gpu_ms)

    @property
    def min_ms(self) -> float:
        """Fastest run."""
        return min(self.gpu_ms)

    @property
    def host_median_ms(self) -> float:
        """Median host-clock time of the same runs."""
        return statistics.median(self.host_ms)

    @property
    def gap_ms(self) -> float:
        """Median of host minus event time per run."""
        return statistics.median(h - g for h, g in zip(self.host_ms, self.gpu_ms))


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

    def __init__(self, trusted: Trusted, flusher: L2Flusher) -> None:
        self.t = trusted
        self.flush = flusher
        self.calibrated_gap_ms = 0.0

    def _one(self, fn: Callable[..., Any], args: Sequence[Any]) -> tuple[Any, float, float]:
        t = self.t
        start = t.event_cls(enable_timing=True)
        end = t.event_cls(enable_timing=True)
        self.flush()
        t.synchronize()
        h0 = t.perf_counter_ns()
        t.event_record(start)
        out = fn(*args)
        t.event_record(end)
        t.synchronize()
        h1 = t.perf_counter_ns()
        return out, float(t.event_elapsed_time(start, end)), (h1 - h0) / 1e6

    def calibrate(self, runs: int = 20) -> float:
        """Host-minus-event gap of a one-kernel call: what this process's own overhead looks like."""
        x = torch.zeros(1024, device="cuda")
        gaps = []
        with paused_gc():
            for _ in range(runs):
                _, g, h = self._one(lambda: x.add_(1.0), ())
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
        _, g, h = self._one(fn, make_args(-1))
        per = max(g, h, 1e-3) / 1e3
        return int(min(MAX_RUNS, max(MIN_RUNS, TARGET_TIMED_S / per)))

    def series(
        self,
        fn: Callable[..., Any],
        make_args: Callable[[int], Sequence[Any]],
        runs: int,
        warmup: int,
        check: Callable[[int, Any], str | None] | None = None,
    ) -> RunStats:
        """`warmup` untimed runs, then `runs` timed ones; `make_args(i)` makes fresh inputs for run i
        (called outside the timed region); `check(i, out)` returns an error text for a wrong output.
        The caller makes sure that `guards_active()` is empty."""
        for i in range(warmup):
            fn(*make_args(-1 - i))
        self.t.synchronize()
        stats = RunStats()
        with paused_gc():
            for i in range(runs):
                args = make_args(i)
                out, g, h = self._one(fn, args)
                stats.gpu_ms.append(g)
                stats.host_ms.append(h)
                if check is not None:
                    err = check(i, out)
                    if err:
                        stats.errors.append(f"run {i}: {err}")
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


# Peak dense throughput per dtype family (FLOP/s) used for the roofline bound: the fastest any
# unit of the chip can do that dtype (tensor cores included), from NVIDIA's H100/H200 SXM data
# sheets. Unknown GPUs get no compute bound.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H100": {"float64": 67e12, "float32": 495e12, "float16": 989e12, "bfloat16": 989e12, "float8": 1979e12},
    "H200": {"float64": 67e12, "float32": 495e12, "float16": 989e12, "bfloat16": 989e12, "float8": 1979e12},
}


def dram_bandwidth(props: Any) -> float | None:
    """Peak DRAM bytes/s from the device properties (memory clock x bus width x 2 for DDR)."""
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    if not clock_khz or not bus_bits:
        return None
    return clock_khz * 1e3 * 2 * bus_bits / 8


def peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    """The roofline compute peak for `dtype` on this GPU, or None when unknown."""
    family = next((k for k in PEAK_FLOPS if k in device_name), None)
    if family is None:
        return None
    name = str(dtype).replace("torch.", "")
    if name.startswith("float8"):
        name = "float8"
    return PEAK_FLOPS[family].get(name)


def roofline_ms(bytes_moved: int, flops: float, bandwidth: float | None, peak: float | None) -> float | None:
    """Lower bound on the time: moving `bytes_moved` through DRAM, or `flops` at peak, whichever is longer."""
    bounds = []
    if bandwidth:
        bounds.append(bytes_moved / bandwidth)
    if peak and flops:
        bounds.append(flops / peak)
    return max(bounds) * 1e3 if bounds else None
