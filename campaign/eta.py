"""How long an eval still has to run, from the per-problem times it measured (plain Python).

An eval's problems take turns on the GPU, one after another; what is left is the number of problems
still to verify times what one took. The first problem is no measure of the rest: it pays the cold
start (its own build could not be made ahead of anything) while the later ones find their builds
made. So the estimate uses the mean time of the problems after the first once there are any (the
pace: where builds, not the GPU, set it, a problem whose build was made beside another's takes no
time and the next one a whole build, and only their mean is the pace), the first problem's alone
(said as such) before that, and says "ETA unknown" until a problem has finished. Problems that need
no verification (no solution, evaluated already) cost nothing and are not counted. Where `lanes`
verifications run at once (an eval on a cluster of that many GPUs), the problems after the running one
take that much less time.
"""

from __future__ import annotations

import statistics

__all__ = ["OVERALL", "Eta", "duration"]

OVERALL = "*"
"""The problem name under which an eval reports the whole run's progress (done, total, ETA) to its
progress callback, beside the problems' own."""


def duration(seconds: float) -> str:
    """`42 s`, `3 min 05 s`, `2 h 07 min`: a duration as a person reads it."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Eta:
    """The remaining time of `todo` verifications, from the times of those finished so far."""

    def __init__(self, todo: int, lanes: int = 1) -> None:
        self.todo = todo
        self.lanes = max(1, lanes)  # verifications that run at once (an eval on a cluster: its GPUs)
        self.times: list[float] = []

    @property
    def left(self) -> int:
        """Verifications not finished yet (the running one included)."""
        return max(0, self.todo - len(self.times))

    def finished(self, seconds: float) -> None:
        """One verification took `seconds` (from its start to its end, its wait for builds included)."""
        self.times.append(max(0.0, seconds))

    def per_problem(self) -> float | None:
        """The time one more verification is expected to take, or None before any finished."""
        if not self.times:
            return None
        later = self.times[1:]
        return statistics.fmean(later) if later else self.times[0]

    def remaining(self, running_for: float = 0.0) -> float | None:
        """Seconds left, the running verification (`running_for` seconds in) counted as at least
        nearly done; None while unknown."""
        each = self.per_problem()
        if each is None:
            return None
        if self.left == 0:
            return 0.0
        return (self.left - 1) * each / self.lanes + max(each - running_for, 0.0)

    def text(self, running_for: float = 0.0) -> str:
        """`ETA 4 min 10 s`, `ETA about 9 min (from the first problem, cold start included)`, or
        `ETA unknown (no problem finished yet)`."""
        if self.left == 0:
            return "done"
        left = self.remaining(running_for)
        if left is None:
            return "ETA unknown (no problem finished yet)"
        if len(self.times) == 1:
            return f"ETA about {duration(left)} (from the first problem, cold start included)"
        return f"ETA {duration(left)}"
