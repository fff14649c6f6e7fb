"""The phases of one verification and of one kernel census, as progress and endings name them.

A worker reports the phase it is in; the pool shows it as progress (`PHASES` orders the steps) and,
when a worker times out or dies, says where (`PHASE_WORDS`, `CENSUS_WORDS`), so that a verdict's
summary reads "timed out while timing ModelNew.forward", not a phase code.
"""

from __future__ import annotations

__all__ = ["CENSUS_WORDS", "PHASES", "PHASE_WORDS"]

PHASES = ("static", "import", "construct", "check", "census", "probes", "timing", "baselines", "evidence",
          "compile")
PHASE_WORDS = {
    "queued": "waiting for the worker to start on it",
    "static": "running static checks",
    "import": "importing and building the candidate",
    "construct": "constructing ModelNew",
    "check": "running ModelNew.forward on the input sets",
    "census": "listing the kernels one forward launches (in the census worker)",
    "probes": "probing the precision of ModelNew.forward against a float64 reference",
    "timing": "timing ModelNew.forward (interleaved with the reference where eager is timed anew)",
    "baselines": "timing the torch.compile baseline (first verdict of a problem) and comparing",
    "evidence": "checking a result above the review threshold further (more inputs, weights, a second shape, its work)",
    "compile": "compiling the candidate's CUDA sources",
}
CENSUS_WORDS = {
    "queued": "waiting for the census worker",
    "import": "importing the candidate for the kernel census",
    "construct": "constructing ModelNew for the kernel census",
    "census": "running forward for the kernel census",
    "reference": "measuring the reference's device time (in the census worker)",
}

