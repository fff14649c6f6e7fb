"""What the harness concludes about a candidate: integrity findings, and (below) the verify result.

A finding is evidence with a message an agent can act on. Codes are listed, with the exploit
each names, in docs/architecture.md.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict


class FindingCode(str, Enum):
    """One code per exploit class the harness defends against."""

    reused_reference_output = "reused_reference_output"
    uninitialized_output = "uninitialized_output"
    constant_output = "constant_output"
    distribution_shortcut = "distribution_shortcut"
    ignores_inputs = "ignores_inputs"
    input_mutated = "input_mutated"
    library_call = "library_call"
    reference_fallback = "reference_fallback"
    result_caching = "result_caching"
    deferred_work = "deferred_work"
    seed_prediction = "seed_prediction"
    unsynchronized_work = "unsynchronized_work"
    background_thread = "background_thread"
    wrong_output_type = "wrong_output_type"
    harness_tampering = "harness_tampering"
    forged_result = "forged_result"
    precision_lowered = "precision_lowered"
    l2_persistence = "l2_persistence"
    timed_output_mismatch = "timed_output_mismatch"
    stateful_forward = "stateful_forward"
    no_custom_kernel = "no_custom_kernel"
    implausible_speedup = "implausible_speedup"


# Findings that describe wrong answers rather than cheating: the verdict is `incorrect`, not `invalid`.
INCORRECT_ONLY = frozenset({FindingCode.constant_output, FindingCode.precision_lowered})
# Findings that hold a result for review without rejecting it.
REVIEW_ONLY = frozenset({FindingCode.implausible_speedup})


class Finding(BaseModel):
    """One integrity finding: what was seen, where, and how sure we are."""

    model_config = ConfigDict(extra="forbid")

    code: FindingCode
    message: str  # actionable: what the candidate did and what to change
    source: str = "runtime"  # static | runtime | timing
    line: int | None = None  # for static findings
