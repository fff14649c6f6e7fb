"""Choosing optimizations: posterior (Thompson) sampling over a state's Scores.

Each candidate's worth is the log-speedup that trying it once more is expected to bring:

    u = p_ok * (mu + follow_on) - (1 - p_ok) * FAILURE_COST

`mu` is the optimization's mean log-speedup in this state and `p_ok` the chance that an attempt
compiles and verifies. Neither is known; the stored statistics give a posterior for each:

* `mu`: a normal posterior. The prior counts as pseudo-observations at the prior mean, so data
  overrule it as they come; how many it counts for, and where its mean really lies, is learned
  from how well the priors predicted what was measured (`Calibration`). The spread of one outcome
  is the measured one (M2) pooled with the calibration's. Untried entries get OPTIMISM on top,
  fading as measurements come.
* `p_ok`: Beta(OK_PRIOR + ok_weight, FAIL_PRIOR + fail_weight).
* `follow_on`: what the state the kernel is likely to reach is worth, relative to staying
  (`policy.phase`); zero where no transition was ever recorded.

One draw from each posterior ranks the candidates and the k best are the suggestions, so the
first is chosen about as often as the evidence says it is the best. Exploration comes from the
evidence: a few noisy measurements leave wide posteriors and the draw explores; many consistent
ones concentrate it. `temperature` scales the spread of the draw around the posterior mean: 1 is
plain posterior sampling; the default 0.5 explores less, which earns more over the few hundred
outcomes a KB sees per state (shrinking the posterior for the draw is a known way to trade
asymptotic exploration for short-run gain: Chapelle and Li, "An Empirical Evaluation of Thompson
Sampling", NIPS 2011; measured here in bench/learning_sim.py); 0 ranks by the posterior means
(greedy, the same answer without a seed).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kb_mcp.kb.models import CALIBRATION_FIELDS, Score, ScoreStats, calibration_terms
from kb_mcp.policy.update import INFLUENCE_SDS, MIN_SD

DEFAULT_TEMPERATURE = 0.5
"""Scale of the posterior draw: 1 samples the posterior, 0 is greedy on the posterior mean."""
MAX_TEMPERATURE = 5.0
PRIOR_SD = 0.3
"""Spread (log units) of true means around their priors, and of one outcome around its mean,
believed before anything is measured."""
PRIOR_SD_WEIGHT = 2.0
"""Pseudo-observations PRIOR_SD counts for when pooled with the measured spread of outcomes."""
CALIBRATION_WEIGHT = 3.0
"""Measured optimizations' worth of belief in a calibration before the data (a state's: the whole
track's; the track's: the priors as they are)."""
PRIOR_DOF = 3.0
"""Degrees of freedom of the Student-t prior (how readily a contradicted prior gives way)."""
CALIBRATION_PASSES = 2
"""Reweighted fits of a state's calibration (Student-t weights, the first judged against the track's)."""
MIN_PRIOR_SD = 0.05
MIN_PRIOR_SAMPLES, MAX_PRIOR_SAMPLES = 0.1, 4.0
"""Bounds on what a prior of weight 1 may count for, however well or badly priors predicted."""
OPTIMISM = math.log(1.05)
"""Bonus for untried entries (as if they promised 5 % more than their prior), fading with evidence."""
OK_PRIOR, FAIL_PRIOR = 1.5, 0.5
"""Beta prior of the chance an attempt compiles and verifies: mean 0.75, worth two attempts."""
FAILURE_COST = math.log(1.05)
"""What a failed attempt (no compile, wrong result) costs, in log-speedup units."""


# ---- calibration: how good are the priors? -------------------------------------------------------


@dataclass(frozen=True)
class CalibrationSums:
    """Sufficient statistics of measured means against prior means over many optimizations (a whole
    KB track, kept up to date by the KB: `KBView.calibration_sums`); fields as `kb.tables.CALIBRATION_FIELDS`."""

    weight: float = 0.0
    prior: float = 0.0
    measured: float = 0.0
    prior2: float = 0.0
    cross: float = 0.0
    measured2: float = 0.0
    noise: float = 0.0
    m2: float = 0.0
    dof: float = 0.0

    @classmethod
    def of(cls, scores: Iterable[Score]) -> CalibrationSums:
        """The sums over `scores` (those with measurements count)."""
        acc = [0.0] * len(CALIBRATION_FIELDS)
        for s in scores:
            terms = calibration_terms(s.prior_mean_log_speedup, s.mean_log_speedup, s.m2_log_speedup, s.weight,
                                      s.prior_weight)
            for i, x in enumerate(terms):
                acc[i] += x
        return cls(*acc)


@dataclass(frozen=True)
class Calibration:
    """How a state's priors relate to what was measured there, and how noisy one outcome is.

    The true means of a state's optimizations are modelled as `centre + shift + slope * (prior -
    centre) + residual` (`centre`: the mean of the state's priors), fitted to the measured ones by
    weighted least squares and shrunk, over CALIBRATION_WEIGHT optimizations' worth, toward the
    fit over the whole track (itself shrunk toward shift 0, slope 1). `prior_sd` is the residuals'
    spread, `noise_sd` the spread of one outcome around its optimization's mean. A prior of weight
    1 then counts for (noise_sd / prior_sd)^2 samples: priors that predicted well are trusted,
    priors that did not are overruled by the first measurements, and priors that ranked
    optimizations the wrong way round are read the right way round.
    """

    centre: float = 0.0
    shift: float = 0.0
    slope: float = 1.0
    prior_sd: float = PRIOR_SD
    noise_sd: float = PRIOR_SD

    @property
    def prior_samples(self) -> float:
        """Pseudo-samples a prior of weight 1 counts for under this calibration."""
        ratio = (self.noise_sd / self.prior_sd) ** 2
        return min(MAX_PRIOR_SAMPLES, max(MIN_PRIOR_SAMPLES, ratio))

    def prior_mean(self, prior: float) -> float:
        """The calibrated prior mean of an optimization whose stored prior mean is `prior`."""
        return self.centre + self.shift + self.slope * (prior - self.centre)


def track_calibration(sums: CalibrationSums | None) -> tuple[float, float, float, float]:
    """(intercept, slope, prior_sd, noise_sd) of `measured = intercept + slope * prior` over a whole
    track, shrunk toward (0, 1, PRIOR_SD, PRIOR_SD) over CALIBRATION_WEIGHT optimizations' worth."""
    if sums is None or sums.weight <= 0:
        return 0.0, 1.0, PRIOR_SD, PRIOR_SD
    k0 = CALIBRATION_WEIGHT
    noise2 = (sums.m2 + PRIOR_SD_WEIGHT * PRIOR_SD**2) / (sums.dof + PRIOR_SD_WEIGHT)
    sv = sums.weight
    px, my = sums.prior / sv, sums.measured / sv
    sxx = max(sums.prior2 - sv * px * px, 0.0)
    sxy = sums.cross - sv * px * my
    spread = max(sxx / sv, 1e-6)
    slope = (sxy + k0 * spread) / (sxx + k0 * spread)
    intercept = (sums.measured - slope * sums.prior) / (sv + k0)
    rss = (sums.measured2 - 2 * intercept * sums.measured - 2 * slope * sums.cross + intercept**2 * sv
           + 2 * intercept * slope * sums.prior + slope**2 * sums.prior2)
    prior2 = (k0 * PRIOR_SD**2 + rss - noise2 * sums.noise) / (k0 + sv)
    return intercept, slope, math.sqrt(max(MIN_PRIOR_SD**2, prior2)), math.sqrt(noise2)


def calibrate(scores: Sequence[Score | ScoreStats], base: CalibrationSums | None = None) -> Calibration:
    """The calibration of one state's priors from its scores (or their `ScoreStats`), shrunk toward
    the track's (`base`)."""
    if not scores:
        return Calibration()
    intercept0, slope0, prior_sd0, noise_sd0 = track_calibration(base)
    # the centre of the priors that still count (a retired prior's mean is what an old truth was)
    priors = [s.prior_mean_log_speedup for s in scores if s.prior_weight > 0] or [
        s.prior_mean_log_speedup for s in scores
    ]
    centre = sum(priors) / len(priors)
    spread = sum((p - centre) ** 2 for p in priors) / len(priors)
    shift0 = intercept0 - centre * (1.0 - slope0)
    m2 = dof = 0.0
    rows = []
    for s in scores:
        if s.weight > 0:
            m2 += max(s.m2_log_speedup, 0.0)
            dof += max(s.weight - 1.0, 0.0)
        if s.weight > 0 and s.prior_weight > 0:  # a retired prior says nothing about the others
            rows.append((s.weight / (s.weight + 1.0), s.prior_mean_log_speedup - centre, s.mean_log_speedup - centre,
                         s.weight))
    noise2 = (m2 + PRIOR_SD_WEIGHT * noise_sd0**2) / (dof + PRIOR_SD_WEIGHT)
    if not rows:
        return Calibration(centre=centre, shift=shift0, slope=slope0, prior_sd=prior_sd0, noise_sd=math.sqrt(noise2))
    k0 = CALIBRATION_WEIGHT
    shift, slope, prior2 = shift0, slope0, prior_sd0**2

    def robust(shift: float, slope: float, prior2: float) -> list[float]:
        # Student-t weights: an optimization whose measurements contradict its prior far beyond the
        # others (its prior was plain wrong, or its truth changed) does not discredit the rest.
        return [
            v * (PRIOR_DOF + 1.0) / (PRIOR_DOF + (m - shift - slope * p) ** 2 / (prior2 + noise2 / w))
            for v, p, m, w in rows
        ]

    weights = robust(shift, slope, prior2)  # judged first against the track's calibration
    for _ in range(CALIBRATION_PASSES):
        sv = sum(weights)
        px = sum(u * p for u, (_, p, _, _) in zip(weights, rows)) / sv
        my = sum(u * m for u, (_, _, m, _) in zip(weights, rows)) / sv
        sxx = sum(u * (p - px) ** 2 for u, (_, p, _, _) in zip(weights, rows))
        sxy = sum(u * (p - px) * (m - my) for u, (_, p, m, _) in zip(weights, rows))
        slope = (sxy + k0 * spread * slope0) / (sxx + k0 * spread) if sxx + spread > 1e-12 else slope0
        shift = (sum(u * (m - slope * p) for u, (_, p, m, _) in zip(weights, rows)) + k0 * shift0) / (sv + k0)
        num, den = k0 * prior_sd0**2, k0
        for u, (_, p, m, w) in zip(weights, rows):
            r = m - shift - slope * p
            num += u * (r * r - noise2 / w)
            den += u
        prior2 = max(MIN_PRIOR_SD**2, num / den)
        weights = robust(shift, slope, prior2)
    return Calibration(centre=centre, shift=shift, slope=slope, prior_sd=math.sqrt(prior2), noise_sd=math.sqrt(noise2))


# ---- the posterior of one optimization ------------------------------------------------------------


@dataclass(frozen=True)
class Posterior:
    """What the evidence says about one optimization in one state (log-speedup units)."""

    mean: float  # posterior mean of mu, without the optimism
    optimism: float  # the fading bonus an untried entry gets in the draw
    scale: float  # standard deviation of the posterior of mu
    noise_sd: float  # spread of one outcome around mu
    ok: float  # Beta parameters of p_ok
    fail: float

    @property
    def p_ok(self) -> float:
        """Posterior mean chance that an attempt compiles and verifies."""
        return self.ok / (self.ok + self.fail)


def posterior(score: Score, calibration: Calibration | None = None) -> Posterior:
    """The posterior of `score`'s mean log-speedup and success chance (see module doc)."""
    cal = calibration or Calibration()
    w0 = max(score.prior_weight, 1e-6) * cal.prior_samples
    weight = max(score.weight, 0.0)
    prior = cal.prior_mean(score.prior_mean_log_speedup)
    noise2 = (max(score.m2_log_speedup, 0.0) + PRIOR_SD_WEIGHT * cal.noise_sd**2) / (weight + PRIOR_SD_WEIGHT)
    if weight > 0:
        # A Student-t prior rather than a normal one: where the measurements contradict the prior by
        # z standard deviations, the prior counts (dof + 1) / (dof + z^2) times less (true effects
        # are heavy-tailed, and a prior can be plain wrong for one optimization or go stale).
        z2 = (score.mean_log_speedup - prior) ** 2 / (cal.prior_sd**2 + noise2 / weight)
        w0 *= min(1.0, (PRIOR_DOF + 1.0) / (PRIOR_DOF + z2))
    total = weight + w0
    mean = (score.mean_log_speedup * weight + prior * w0) / total
    return Posterior(
        mean=mean,
        optimism=OPTIMISM * w0 / total,
        scale=math.sqrt(noise2 / total),
        noise_sd=math.sqrt(noise2),
        ok=OK_PRIOR + max(score.ok_weight, 0.0),
        fail=FAIL_PRIOR + max(score.fail_weight, 0.0),
    )


def influence_band(score: Score, calibration: Calibration | None = None) -> tuple[float, float]:
    """Where one new measurement of `score` may land and still count in full (log units): the
    posterior mean ± INFLUENCE_SDS x max(MIN_SD, sd of a new outcome around it)."""
    post = posterior(score, calibration)
    half = INFLUENCE_SDS * max(MIN_SD, math.hypot(post.noise_sd, post.scale))
    return post.mean - half, post.mean + half


def _worth(p_ok: float, mu: float, follow_on: float) -> float:
    return p_ok * (mu + follow_on) - (1.0 - p_ok) * FAILURE_COST


def expected_utility(score: Score, follow_on: float = 0.0, calibration: Calibration | None = None) -> float:
    """Posterior expected log-speedup of trying this optimization once more (without the optimism)."""
    post = posterior(score, calibration)
    return _worth(post.p_ok, post.mean, follow_on)


def _draw(post: Posterior, rng: random.Random, temperature: float, follow_on: float) -> float:
    mu = post.mean + post.optimism
    if temperature <= 0:
        return _worth(post.p_ok, mu, follow_on)
    mu += temperature * post.scale * rng.gauss(0.0, 1.0)
    p_ok = post.p_ok + temperature * (rng.betavariate(post.ok, post.fail) - post.p_ok)
    return _worth(min(1.0, max(0.0, p_ok)), mu, follow_on)


# ---- selection ------------------------------------------------------------------------------------


def _rng(seed: random.Random | int | None) -> random.Random:
    return seed if isinstance(seed, random.Random) else random.Random(seed)


def select_top_k(
    scores: Iterable[Score],
    k: int,
    temperature: float = DEFAULT_TEMPERATURE,
    rng: random.Random | int | None = None,
    *,
    exclude: Iterable[str] = (),
    follow_on: Mapping[str, float] | None = None,
    base: CalibrationSums | None = None,
    calibration: Calibration | None = None,
) -> list[Score]:
    """The k best entries under one posterior draw each, best first (k distinct ones).

    `scores` are one state's candidates (their measurements calibrate its priors, excluded ones
    too) and `base` the track's calibration sums; `calibration`, when given, is that calibration
    already computed (`calibrate(scores, base)`) and `base` is not read. `exclude` drops
    optimization ids (already in this kernel's lineage, say). `rng` is a Random, a seed, or None
    (fresh entropy). `follow_on` adds, per optimization id, the worth of where it is likely to lead
    (`policy.phase.follow_on`).
    Returns fewer than k when fewer remain.
    """
    if k <= 0:
        return []
    every = list(scores)
    skip = set(exclude)
    pool = sorted((s for s in every if s.optimization_id not in skip), key=lambda s: s.optimization_id)
    bonus = follow_on or {}
    r = _rng(rng)
    cal = calibration if calibration is not None else calibrate(every, base)
    keyed = [(_draw(posterior(s, cal), r, temperature, bonus.get(s.optimization_id, 0.0)), s) for s in pool]
    keyed.sort(key=lambda t: (-t[0], t[1].optimization_id))
    return [s for _, s in keyed[:k]]


def first_draw_probabilities(
    scores: Sequence[Score],
    temperature: float = DEFAULT_TEMPERATURE,
    *,
    draws: int = 4000,
    seed: int = 0,
    follow_on: Mapping[str, float] | None = None,
    base: CalibrationSums | None = None,
) -> list[float]:
    """Estimated chance that each entry is the first suggestion (Monte Carlo over `draws` draws of
    `select_top_k`'s rule; one-hot at temperature 0)."""
    if not scores:
        return []
    bonus = follow_on or {}
    r = random.Random(seed)
    cal = calibrate(list(scores), base)
    posts = [posterior(s, cal) for s in scores]
    ids = [s.optimization_id for s in scores]
    wins = [0] * len(scores)
    n = 1 if temperature <= 0 else draws
    for _ in range(n):
        us = [_draw(p, r, temperature, bonus.get(i, 0.0)) for p, i in zip(posts, ids)]
        wins[min(range(len(us)), key=lambda j: (-us[j], ids[j]))] += 1
    return [w / n for w in wins]
