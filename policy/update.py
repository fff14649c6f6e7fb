"""The numeric update: how one measured outcome moves a Score, and how two Scores pool.

Speedups are tracked as log-speedups with Welford's running mean and sum of squared deviations
(M2), so a 2x gain and a 0.5x loss cancel, and pooling two scores (Chan et al.'s parallel
combination) gives exactly the statistics of the union of their samples. Counters:

* `attempts`: every recorded outcome except `needs_gpu` (the candidate was never run, so it says
  nothing about the optimization);
* `samples`: outcomes with a valid timed verdict (faster/slower) and a speedup - these feed the mean;
* `successes`: samples with speedup > 1 (faster than the kernel the optimization started from);
* `compile_failures`: compile_error; `verify_failures`: incorrect, invalid, timeout, crashed.

One outcome moves the mean by at most a bounded amount: its log-speedup is clipped to
±log(MAX_CREDITED_SPEEDUP). The speedup itself is the server's measurement, but its basis can be
a parent the agent names, and a deliberately slow (yet verified) parent would otherwise buy an
optimization any credit it liked. The outcome keeps the unclipped figure.
"""

from __future__ import annotations

import math
from datetime import datetime

from kb_mcp.kb.models import Score, Verdict, utcnow

# Honest single steps beyond this exist (fusing a long elementwise chain), but they are rare enough
# that clipping them costs little, while one unbounded sample can dominate a mean of few samples.
MAX_CREDITED_SPEEDUP = 8.0

COMPILE_FAILURES = frozenset({Verdict.compile_error})
VERIFY_FAILURES = frozenset({Verdict.incorrect, Verdict.invalid, Verdict.timeout, Verdict.crashed})
UNINFORMATIVE = frozenset({Verdict.needs_gpu})


def counts_toward_score(verdict: Verdict) -> bool:
    """False for verdicts that say nothing about the optimization (the candidate never ran)."""
    return verdict not in UNINFORMATIVE


def credited_log_speedup(speedup: float) -> float:
    """log(speedup), clipped to ±log(MAX_CREDITED_SPEEDUP): what one outcome may contribute."""
    bound = math.log(MAX_CREDITED_SPEEDUP)
    return max(-bound, min(bound, math.log(speedup)))


def apply_outcome(score: Score, verdict: Verdict, speedup: float | None, when: datetime | None = None) -> Score:
    """`score` after one outcome with this verdict and (for valid verdicts) measured speedup."""
    if not counts_toward_score(verdict):
        return score
    n, mean, m2 = score.samples, score.mean_log_speedup, score.m2_log_speedup
    successes, cf, vf = score.successes, score.compile_failures, score.verify_failures
    if verdict.is_valid and speedup is not None and speedup > 0 and math.isfinite(speedup):
        x = credited_log_speedup(speedup)
        n += 1
        delta = x - mean
        mean += delta / n
        m2 += delta * (x - mean)  # Welford: uses the mean before and after this sample
        successes += speedup > 1.0
    elif verdict in COMPILE_FAILURES:
        cf += 1
    elif verdict in VERIFY_FAILURES:
        vf += 1
    # a valid verdict without a speedup (no baseline timing) counts as an attempt only
    return score.model_copy(
        update={
            "samples": n,
            "mean_log_speedup": mean,
            "m2_log_speedup": m2,
            "attempts": score.attempts + 1,
            "successes": successes,
            "compile_failures": cf,
            "verify_failures": vf,
            "prior": False,
            "updated_at": when or utcnow(),
        }
    )


def _pooled(na: int, ma: float, m2a: float, nb: int, mb: float, m2b: float) -> tuple[int, float, float]:
    n = na + nb
    if n == 0:
        return 0, 0.0, 0.0
    delta = mb - ma
    return n, ma + delta * nb / n, m2a + m2b + delta * delta * na * nb / n


def merge_scores(a: Score, b: Score) -> Score:
    """`a` with `b`'s measurements pooled in (sample statistics of the union of both sample sets).

    The prior stays `a`'s: a prior is a belief about the optimization, not evidence, so two
    copies of the same seed prior must not count twice. Identity fields are `a`'s.
    """
    n, mean, m2 = _pooled(a.samples, a.mean_log_speedup, a.m2_log_speedup, b.samples, b.mean_log_speedup, b.m2_log_speedup)
    return a.model_copy(
        update={
            "samples": n,
            "mean_log_speedup": mean,
            "m2_log_speedup": m2,
            "attempts": a.attempts + b.attempts,
            "successes": a.successes + b.successes,
            "compile_failures": a.compile_failures + b.compile_failures,
            "verify_failures": a.verify_failures + b.verify_failures,
            "prior": a.prior and b.prior,
            "updated_at": max(a.updated_at, b.updated_at),
        }
    )


def subtract_scores(total: Score, part: Score) -> Score:
    """`total` without the measurements of `part` (the inverse of `merge_scores`).

    Used when merging KB files that share history: the outcomes both files hold are taken out of
    one side before pooling, so they are counted once. Counts are clamped at zero should `part`
    not actually be contained in `total`.
    """
    n = total.samples - part.samples
    if n <= 0:
        n, mean, m2 = 0, 0.0, 0.0
    else:
        mean = (total.mean_log_speedup * total.samples - part.mean_log_speedup * part.samples) / n
        delta = part.mean_log_speedup - mean
        m2 = max(0.0, total.m2_log_speedup - part.m2_log_speedup - delta * delta * n * part.samples / total.samples)
    attempts = max(0, total.attempts - part.attempts)
    return total.model_copy(
        update={
            "samples": n,
            "mean_log_speedup": mean,
            "m2_log_speedup": m2,
            "attempts": attempts,
            "successes": max(0, total.successes - part.successes),
            "compile_failures": max(0, total.compile_failures - part.compile_failures),
            "verify_failures": max(0, total.verify_failures - part.verify_failures),
            "prior": total.prior or attempts == 0,
        }
    )


def empty_like(score: Score) -> Score:
    """A Score with `score`'s identity and prior but no measurements."""
    return score.model_copy(
        update={
            "samples": 0, "mean_log_speedup": 0.0, "m2_log_speedup": 0.0, "attempts": 0, "successes": 0,
            "compile_failures": 0, "verify_failures": 0, "prior": True,
        }
    )


def posterior_mean_log_speedup(score: Score) -> float:
    """Measured mean shrunk toward the prior mean by the prior's weight (log space)."""
    if score.samples + score.prior_weight <= 0:
        return 0.0
    return math.log(score.expected_speedup)
