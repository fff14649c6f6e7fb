"""Means over seeds with their 95 % t-intervals."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

_T975 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 24: 2.064, 29: 2.045, 39: 2.023, 59: 2.001}


def interval(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95 % t-interval) over seeds; infinities and NaNs left out."""
    vs = [v for v in values if math.isfinite(v)]
    if not vs:
        return math.nan, math.nan
    if len(vs) == 1:
        return vs[0], math.nan
    df = len(vs) - 1
    t = _T975.get(df) or _T975[max(k for k in _T975 if k <= df)]
    return statistics.fmean(vs), t * statistics.stdev(vs) / math.sqrt(len(vs))


def fmt(values: Sequence[float], digits: int = 2) -> str:
    """'mean ± half-width' of `values` over seeds ('-' when there are none)."""
    m, h = interval(values)
    if math.isnan(m):
        return "-"
    return f"{m:.{digits}f} ± {h:.{digits}f}" if math.isfinite(h) else f"{m:.{digits}f}"
