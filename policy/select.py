"""Choosing optimizations: weighted random top-k without replacement over a state's Scores.

Each candidate gets a utility, the expected log-speedup of trying it:

    u = p_ok * posterior_mean - (1 - p_ok) * failure_cost

where `posterior_mean` is the measured mean log-speedup shrunk toward the prior, and `p_ok` the
estimated chance that an attempt compiles and verifies (measurements shrunk toward 1 by the
prior weight). Untried entries (no attempts) get an optimistic prior: their utility is raised by
`optimism`, so an optimization nobody has measured yet still gets drawn now and then instead of
being starved by one lucky measured entry.

Draws are proportional to exp(u / temperature), k distinct ones, without replacement (the
Gumbel-top-k trick: adding independent Gumbel noise to u / T and keeping the k largest is exactly
sequential sampling without replacement). Temperature 0 is greedy: the k best utilities.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

from kb_mcp.kb.models import Score
from kb_mcp.policy.update import posterior_mean_log_speedup

DEFAULT_TEMPERATURE = 0.3
"""In log-speedup units: a +0.3 advantage in utility (x1.35 speedup) weighs e (2.7) times more."""
DEFAULT_OPTIMISM = math.log(1.10)
"""Bonus for untried entries: treated as if they promised 10 % more than their prior says."""
FAILURE_COST = math.log(1.05)
"""What a failed attempt (no compile, wrong result) costs, in log-speedup units."""


def success_probability(score: Score) -> float:
    """Chance an attempt yields a valid, timed result; the prior weight pulls it toward 1."""
    failures = score.compile_failures + score.verify_failures
    total = score.samples + failures + score.prior_weight
    return (score.samples + score.prior_weight) / total if total > 0 else 1.0


def utility(score: Score, *, optimism: float = DEFAULT_OPTIMISM, failure_cost: float = FAILURE_COST) -> float:
    """Expected log-speedup of trying this optimization once more (see module doc)."""
    p_ok = success_probability(score)
    u = p_ok * posterior_mean_log_speedup(score) - (1.0 - p_ok) * failure_cost
    if score.attempts == 0:
        u += optimism
    return u


def _rng(seed: random.Random | int | None) -> random.Random:
    return seed if isinstance(seed, random.Random) else random.Random(seed)


def selection_probabilities(
    scores: Sequence[Score], temperature: float = DEFAULT_TEMPERATURE, *, optimism: float = DEFAULT_OPTIMISM
) -> list[float]:
    """Probability of each entry being the first draw (softmax of u / T; greedy one-hot at T = 0)."""
    if not scores:
        return []
    us = [utility(s, optimism=optimism) for s in scores]
    if temperature <= 0:
        best = min(range(len(us)), key=lambda i: (-us[i], scores[i].optimization_id))
        return [1.0 if i == best else 0.0 for i in range(len(us))]
    top = max(us)
    ws = [math.exp((u - top) / temperature) for u in us]
    total = sum(ws)
    return [w / total for w in ws]


def select_top_k(
    scores: Iterable[Score],
    k: int,
    temperature: float = DEFAULT_TEMPERATURE,
    rng: random.Random | int | None = None,
    *,
    optimism: float = DEFAULT_OPTIMISM,
    exclude: Iterable[str] = (),
) -> list[Score]:
    """k distinct entries drawn without replacement with probability proportional to exp(u / T).

    `exclude` drops optimization ids (already tried on this kernel, say). `rng` is a Random, a
    seed, or None (fresh entropy). Returns fewer than k when fewer candidates remain; order is
    the draw order (the first is the first draw).
    """
    if k <= 0:
        return []
    skip = set(exclude)
    pool = [s for s in scores if s.optimization_id not in skip]
    if temperature <= 0:
        ranked = sorted(pool, key=lambda s: (-utility(s, optimism=optimism), s.optimization_id))
        return ranked[:k]
    r = _rng(rng)
    keyed = []
    for s in pool:
        u = r.random() or 5e-324  # in (0, 1): both logs below stay finite
        g = -math.log(-math.log(u))  # Gumbel(0, 1) noise
        keyed.append((utility(s, optimism=optimism) / temperature + g, s))
    keyed.sort(key=lambda t: (-t[0], t[1].optimization_id))
    return [s for _, s in keyed[:k]]
