"""The phases of one verification and of one kernel census, as progress and endings name them.

A worker reports the phase it is in; the pool shows it as progress (`PHASES` orders the steps) and,
when a worker times out or dies, says where (`PHASE_WORDS`, `CENSUS_WORDS`), so that a verdict's
summary reads "timed out while timing ModelNew.forward", not a phase code.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["BASELINE_WORDS", "CENSUS_WORDS", "PHASES", "PHASE_WORDS", "PhaseClock", "StepClock"]

PHASES = ("static", "import", "construct", "check", "census", "probes", "timing", "baselines", "evidence",
          "finish", "compile")
PHASE_WORDS = {
    "build_first": "building the candidate's load_inline extensions before taking the GPU lane",
    "lane": "waiting in line for the GPU lane",
    "queued": "waiting for the worker to start on it",
    "static": "running static checks",
    "import": "importing and building the candidate",
    "construct": "constructing ModelNew",
    "check": "running ModelNew.forward on the input sets",
    "census": "listing the kernels one forward launches (in the census worker)",
    "probes": "probing the precision of ModelNew.forward against a float64 reference",
    "timing": "timing ModelNew.forward (interleaved with the reference where eager is timed anew)",
    "baselines": "comparing the candidate's times with the baselines",
    "reference_baselines": ("timing the reference's eager and torch.compile baselines (a problem's first verdict "
                            "on this GPU) in a worker no candidate ran in"),
    "evidence": "checking a result above the review threshold further (more inputs, weights, a second shape, its work)",
    "finish": "freeing what the verification held and answering",
    "compile": "compiling the candidate's CUDA sources",
}
BASELINE_WORDS = {  # a baselines request's phases (`worker.baseline_run`), no candidate in it
    "queued": "waiting for the worker to start on the problem",
    "eager": "timing the problem's eager forward",
    "compile": "compiling and timing the problem with torch.compile",
}
CENSUS_WORDS = {
    "queued": "waiting for the census worker",
    "import": "importing the candidate for the kernel census",
    "construct": "constructing ModelNew for the kernel census",
    "census": "running forward for the kernel census",
    "reference": "measuring the reference's device time (in the census worker)",
}


class PhaseClock:
    """Where one request's seconds went, phase by phase, as the pool sees it: from each phase frame
    to the next (a phase entered twice adds up), the last one until the answer, and "queued" (or
    `first`) from the request to the first frame. Times are `time.monotonic()` readings the caller passes in."""

    def __init__(self, start: float, first: str = "queued") -> None:
        self._marks: list[tuple[str, float]] = [(first, start)]

    def enter(self, phase: str, now: float) -> None:
        """The worker reported `phase` at `now`."""
        self._marks.append((phase, now))

    def seconds(self, end: float) -> dict[str, float]:
        """Seconds per phase up to `end`, rounded to milliseconds, in the order first entered."""
        out: dict[str, float] = {}
        for (phase, start), (_, stop) in zip(self._marks, [*self._marks[1:], ("", end)]):
            out[phase] = round(out.get(phase, 0.0) + max(0.0, stop - start), 3)
        return out


class StepClock:
    """Where the seconds of a run of steps went, as one process sees them: `mark(step)` ends `step`
    at the time of the call (each from the end of the one before). `nested` puts the steps a worker
    reported for one of them in its place, the rest of that step (the channel, the reply) under
    `<step>_rest`, so the parts still add up to the whole."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()
        self.seconds: dict[str, float] = {}

    def mark(self, step: str) -> None:
        """Ends `step` now (a step marked twice adds up)."""
        now = self._clock()
        self.seconds[step] = round(self.seconds.get(step, 0.0) + max(0.0, now - self._last), 3)
        self._last = now

    def nested(self, step: str, inner: dict[str, float]) -> dict[str, float]:
        """The steps, with `inner` (a worker's own steps of `step`) in the place of `step`."""
        out: dict[str, float] = {}
        for name, secs in self.seconds.items():
            if name != step or not inner:
                out[name] = secs
                continue
            out.update(inner)
            rest = round(secs - sum(inner.values()), 3)
            if rest > 0:
                out[f"{step}_rest"] = rest
        return out
