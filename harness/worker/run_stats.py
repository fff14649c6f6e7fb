"""The times of one timed series and when they are known well enough to stop (worker side; no torch).

A series stops early in two ways. Its median may be known precisely: the distribution-free 95 %
interval of the median (`median_interval`) within +-PRECISION of it, after PRECISE_MIN_RUNS runs
(`RunStats.precise`). Or it may be known well enough to decide the verdict: where the time at which
the verdict turns is known before the series (a cached, GPU-bound baseline: faster below it, slower
above), the wider 99 % interval lying wholly on one side of it and within +-DECIDED_PRECISION of the
median (`RunStats.decided`). A call of a fraction of a millisecond took about a hundred runs to reach
+-1 % on an H200 while its verdict was plain after twenty; each run costs its fresh inputs and
re-checked output, several times the call. The wider interval pays for looking after every run
(each look is one more chance for a 95 % interval to miss), and the precision bound keeps the
recorded speedup within a few percent.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "DECIDED_PRECISION", "DECIDE_Z", "PRECISE_MIN_RUNS", "PRECISION", "RunStats", "median_interval",
]

# A series stops once the median of its event times is known this closely (the 95 % interval
# `median_interval` within +-PRECISION of the median) after PRECISE_MIN_RUNS runs: a GPU-bound call
# of a fraction of a millisecond is that stable within a few dozen runs, and each run beyond them
# costs its fresh inputs and re-checked output, several times the call itself.
PRECISION = 0.01
PRECISE_MIN_RUNS = 20
# ... or once its verdict is decided (`RunStats.decided`): the 99 % interval (z = 2.576) on one side of
# the time at which the verdict turns, and within +-DECIDED_PRECISION of the median.
DECIDE_Z = 2.576
DECIDED_PRECISION = 0.03


@dataclass
class RunStats:
    """Per-run times of one timed series (milliseconds)."""

    gpu_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)
    # host time until the call returned and its end event was queued
    issue_ms: list[float] = field(default_factory=list)
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
    def issue_median_ms(self) -> float:
        """Median host time to issue the call (launches queued, nothing waited for)."""
        return statistics.median(self.issue_ms)

    @property
    def gap_ms(self) -> float:
        """Median of host minus event time per run."""
        return statistics.median(h - g for h, g in zip(self.host_ms, self.gpu_ms))

    def precise(self, precision: float) -> bool:
        """Whether the median event time is known to within +-`precision` of itself (its 95 %
        interval, `median_interval`), after at least PRECISE_MIN_RUNS runs."""
        if len(self.gpu_ms) < PRECISE_MIN_RUNS:
            return False
        lo, hi = median_interval(self.gpu_ms)
        return hi - lo <= 2 * precision * self.median_ms

    def decided(self, turns_at_ms: float) -> bool:
        """Whether the verdict against a baseline of `turns_at_ms` is known: after at least
        PRECISE_MIN_RUNS runs, the median's 99 % interval wholly below or wholly above it, and
        within +-DECIDED_PRECISION of the median."""
        if len(self.gpu_ms) < PRECISE_MIN_RUNS:
            return False
        lo, hi = median_interval(self.gpu_ms, DECIDE_Z)
        one_side = hi < turns_at_ms or lo > turns_at_ms
        return one_side and hi - lo <= 2 * DECIDED_PRECISION * self.median_ms


def median_interval(ms: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """A distribution-free confidence interval of the median of `ms` (at least one value), 95 % at
    the default `z`: the order statistics at ranks (n - z sqrt n) / 2 and 1 + (n + z sqrt n) / 2, as
    the sign test gives them; nothing is assumed about the shape of run times, which are skewed."""
    xs = sorted(ms)
    n = len(xs)
    half = z * math.sqrt(n)
    lo = max(math.floor((n - half) / 2), 1)
    hi = min(math.ceil(1 + (n + half) / 2), n)
    return xs[lo - 1], xs[hi - 1]
