"""The float64 judgment of outputs outside the tolerance by a rounding-sized margin (worker side).

A float32 reference rounds too: over a long sum of large values, or for small outputs left after a
cancellation, its own error can exceed the float32 tolerance, and a candidate more exact than the
reference then fails by that margin. Such an output (`values.rounding_sized`) is judged once more
against a float64 copy of the reference on the same inputs (`probes.against_float64`, the
precision probes' rule): where the candidate errs at most `PROBE_BOUND` times what the float32
reference itself errs, the difference is the reference's rounding and the output passes.

Every output the checks compare goes through it alike: the input sets (`checks.Checker`), the set
with new values in old buffers, and each timed run's output (`timed_checks.TimedChecks`), so a
candidate that is exact while checked and lowers its precision while timed still fails. Once one
output has failed the judgment the verdict is decided, and later outputs are not judged again (a
candidate in a lower precision fails them all: one float64 run, not one per output).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kb_mcp.harness.judgment.probing import ARBITER, PROBE_BOUND, ProbeError
from kb_mcp.harness.worker.probes import against_float64
from kb_mcp.harness.worker.values import Comparison, rounding_sized

__all__ = ["Judgment", "RoundingJudge"]


@dataclass(frozen=True)
class Judgment:
    """What the float64 judgment said of one failed output: passed or not, the message that replaces
    the failure's, and the candidate's error over the float32 reference's (None where it did not run)."""

    passed: bool
    message: str
    ratio: float | None


class RoundingJudge:
    """Judges outputs of one candidate against a float64 copy of its reference (module docstring)."""

    def __init__(self, reference: torch.nn.Module) -> None:
        self.reference = reference
        self.failed = False  # an output failed its judgment: the verdict is decided

    def applies(self, comps: list[Comparison], references: list[torch.Tensor]) -> bool:
        """Whether the failures of these comparisons may be the reference's own rounding."""
        return not all(cm.passed for cm in comps) and rounding_sized(comps, references)

    def judge(self, message: str, candidate: list[torch.Tensor], strict: list[torch.Tensor],
              inputs: Callable[[], list[Any] | None], release: bool = True) -> Judgment:
        """The judgment of `candidate` (failed with `message`) against float64, with the float32
        reference's outputs `strict`; `inputs()` gives the pristine inputs both ran on (made again
        from their seed where they were not kept), asked for only when the judgment runs.
        `release`: the float64 copies' blocks go back to the device afterwards. Between timed runs
        they stay cached instead: an emptied cache would put the next timed run's allocations, and
        their cudaMalloc, inside its timed region."""
        found = self._against_float64(candidate, strict, inputs, release)
        ratio = found.ratio
        if ratio is not None and ratio <= PROBE_BOUND:
            return Judgment(True, (f"{message}; judged against float64 instead: {ratio:.3g}x the float32 reference's "
                                   f"own error there (bound {PROBE_BOUND:g}x), so the difference is the reference's "
                                   "rounding"), ratio)
        self.failed = True
        why = (f"against float64: {ratio:.3g}x the float32 reference's own error (bound {PROBE_BOUND:g}x)"
               if ratio is not None else f"no float64 arbitration: {found.note}")
        return Judgment(False, f"{message}; {why}", ratio)

    def _against_float64(self, candidate: list[torch.Tensor], strict: list[torch.Tensor],
                         inputs: Callable[[], list[Any] | None], release: bool) -> ProbeError:
        """`probes.against_float64` (TF32 settings do not touch float64 arithmetic, so the track's
        numerics stay as they are)."""
        if self.failed:
            return ProbeError(probe=ARBITER, note="an earlier output failed its float64 judgment")
        xs = inputs()
        if not xs:
            return ProbeError(probe=ARBITER, note="the inputs were not kept")
        with torch.no_grad():
            found = against_float64(self.reference, xs, candidate, strict)
        del xs
        if release and torch.cuda.is_available():
            torch.cuda.empty_cache()
        return found
