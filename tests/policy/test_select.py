"""Posterior sampling over a state's scores: draws concentrate with evidence, untried entries are
still explored, k distinct ranked results, repeatable with a seed, exclusions respected, and the
calibration that decides how much priors count."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import astuple
from pathlib import Path

import pytest

from kb_mcp.kb.models import Score
from kb_mcp.kb.store import KBStore
from kb_mcp.policy.select import (
    FAILURE_COST,
    Calibration,
    CalibrationSums,
    calibrate,
    expected_utility,
    first_draw_probabilities,
    influence_band,
    posterior,
    select_top_k,
    track_calibration,
)


def _measured(opt: str, speedup: float, n: int = 10, failures: int = 0, prior: float = 1.0,
              spread: float = 0.2) -> Score:
    return Score(
        state_id="s", optimization_id=opt, samples=n, attempts=n + failures, verify_failures=failures,
        mean_log_speedup=math.log(speedup), m2_log_speedup=spread**2 * max(n - 1, 0), prior=False,
        prior_mean_log_speedup=math.log(prior), prior_weight=1.0,
    )


def _untried(opt: str, prior_speedup: float = 1.0) -> Score:
    return Score(state_id="s", optimization_id=opt, prior_mean_log_speedup=math.log(prior_speedup), prior_weight=1.0)


POOL = [_measured("a_best", 2.0), _measured("b_good", 1.5), _measured("c_meh", 1.1), _measured("d_bad", 0.8),
        _untried("e_new")]


def _firsts(pool: list[Score], draws: int = 2000, seed: int = 7, **kw: object) -> Counter[str]:
    rng = random.Random(seed)
    return Counter(select_top_k(pool, 1, rng=rng, **kw)[0].optimization_id for _ in range(draws))  # type: ignore[arg-type]


def test_better_measured_entries_are_drawn_more_often_and_the_untried_still_are() -> None:
    firsts = _firsts(POOL, temperature=1.0)
    assert firsts["a_best"] > firsts["b_good"] > firsts["d_bad"]
    assert firsts["e_new"] > 20, "an untried entry with a wide posterior must keep being explored"
    # first-draw frequencies match the policy's own estimate of them
    probs = dict(zip((s.optimization_id for s in POOL), first_draw_probabilities(POOL, 1.0, draws=4000, seed=3)))
    for opt, p in probs.items():
        assert firsts[opt] / 2000 == pytest.approx(p, abs=0.03)


def test_draws_concentrate_as_evidence_accumulates() -> None:
    """Two entries 1.3x vs 1.2x apart: with little evidence the draw hesitates, with much it settles."""
    def share_of_best(n: int) -> float:
        pool = [_measured("x_better", 1.3, n=n), _measured("y_worse", 1.2, n=n)]
        # enough other measured scores that the calibration does not bend these two
        return _firsts(pool, draws=1500, temperature=1.0)["x_better"] / 1500

    few, many = share_of_best(2), share_of_best(200)
    assert few < 0.75 < many, (few, many)


def test_k_distinct_ranked_results_and_exclusions() -> None:
    rng = random.Random(3)
    for _ in range(200):
        picks = select_top_k(POOL, 4, rng=rng, exclude=["a_best"])
        ids = [p.optimization_id for p in picks]
        assert len(ids) == len(set(ids)) == 4
        assert "a_best" not in ids
    assert len(select_top_k(POOL, 10, rng=1)) == len(POOL)
    assert select_top_k(POOL, 0, rng=1) == []
    assert select_top_k([], 3, rng=1) == []


def test_temperature_zero_is_greedy_on_the_posterior_and_a_seed_repeats_the_draw() -> None:
    cal = calibrate(POOL)

    def greedy(score: Score) -> float:  # the posterior mean, with the fading optimism for the untried
        post = posterior(score, cal)
        return post.p_ok * (post.mean + post.optimism) - (1 - post.p_ok) * FAILURE_COST

    ranked = sorted(POOL, key=lambda s: -greedy(s))
    for seed in range(10):
        picks = select_top_k(POOL, 3, temperature=0.0, rng=seed)
        assert [p.optimization_id for p in picks] == [s.optimization_id for s in ranked[:3]]
    a = [s.optimization_id for s in select_top_k(POOL, 3, rng=42)]
    b = [s.optimization_id for s in select_top_k(POOL, 3, rng=42)]
    assert a == b
    draws = {tuple(s.optimization_id for s in select_top_k(POOL, 3, temperature=1.0, rng=seed)) for seed in range(40)}
    assert len(draws) > 1
    # a higher temperature explores more: the best is drawn first less often
    assert _firsts(POOL, temperature=2.0)["a_best"] < _firsts(POOL, temperature=0.5)["a_best"]


def test_utility_rewards_speed_and_penalizes_failures() -> None:
    assert expected_utility(_measured("x", 2.0)) > expected_utility(_measured("x", 1.2))
    assert expected_utility(_measured("x", 1.5, n=5, failures=10)) < expected_utility(_measured("x", 1.5, n=5))


def test_follow_on_worth_changes_the_ranking() -> None:
    pool = [_measured("here", 1.3, n=20), _measured("leads_on", 1.25, n=20)]
    assert select_top_k(pool, 1, temperature=0.0)[0].optimization_id == "here"
    assert select_top_k(pool, 1, temperature=0.0, follow_on={"leads_on": 0.2})[0].optimization_id == "leads_on"


# ---- calibration ------------------------------------------------------------------------------------


def _state(priors: list[float], truths: list[float], n: int = 6) -> list[Score]:
    return [
        Score(state_id="s", optimization_id=f"o{i}", prior_mean_log_speedup=p, mean_log_speedup=t, samples=n,
              attempts=n, m2_log_speedup=0.04 * (n - 1), prior=False)
        for i, (p, t) in enumerate(zip(priors, truths))
    ]


def test_priors_that_predicted_well_count_more_than_priors_that_did_not() -> None:
    priors = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    good = calibrate(_state(priors, [p + 0.02 * (-1) ** i for i, p in enumerate(priors)]))
    bad = calibrate(_state(priors, [0.3, -0.2, 0.5, -0.1, 0.0, 0.2]))
    assert good.prior_samples > 2 * bad.prior_samples
    assert good.slope == pytest.approx(1.0, abs=0.2)


def test_priors_ranked_the_wrong_way_round_are_read_the_right_way_round() -> None:
    priors = [0.1 * i for i in range(10)]
    measured = _state(priors, [0.9 - p for p in priors])  # measured: the lower the prior, the better
    untried = [_untried("low", math.exp(0.0)), _untried("high", math.exp(0.9))]
    cal = calibrate(measured + untried)
    assert cal.slope < 0
    assert posterior(untried[0], cal).mean > posterior(untried[1], cal).mean


def test_a_state_without_measurements_follows_the_track_calibration() -> None:
    scores = _state([0.0, 0.2, 0.4], [0.4, 0.2, 0.0])  # reversed everywhere on the track
    sums = CalibrationSums.of(scores * 5)
    _intercept, slope, _, _ = track_calibration(sums)
    assert slope < 0
    fresh = [_untried("a", math.exp(0.0)), _untried("b", math.exp(0.4))]
    cal = calibrate(fresh, sums)
    assert cal.slope < 0 and posterior(fresh[0], cal).mean > posterior(fresh[1], cal).mean
    assert calibrate(fresh) == Calibration(centre=cal.centre)  # no track data: priors as they are


def test_one_contradicted_prior_does_not_discredit_the_others() -> None:
    priors = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    truths = [p + 0.02 for p in priors]
    clean = calibrate(_state(priors, truths))
    truths[5] = -2.0  # this optimization's truth changed (or its prior was plain wrong)
    hit = calibrate(_state(priors, truths))
    assert hit.slope == pytest.approx(clean.slope, abs=0.25)
    assert hit.prior_samples > 0.4 * clean.prior_samples


def test_a_retired_prior_neither_counts_nor_moves_the_calibration(tmp_path: Path) -> None:
    priors = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    truths = [p + 0.02 for p in priors]
    clean = _state(priors, truths)
    truths[5] = -0.1  # the best optimization stopped paying; its prior (0.5) is now stale
    stale = _state(priors, truths)
    retired = [*stale[:5], stale[5].model_copy(update={"prior_weight": 0.0})]
    kept, dropped, base = calibrate(stale), calibrate(retired), calibrate(clean)
    assert kept.slope < base.slope - 0.15, "a stale prior that is still counted lowers the trust in every prior"
    assert dropped.slope == pytest.approx(base.slope, abs=0.05)
    assert dropped.prior_samples == pytest.approx(calibrate(clean[:5]).prior_samples, rel=0.05), "as if not there"
    assert dropped.prior_samples > 1.3 * kept.prior_samples
    assert posterior(retired[5], dropped).mean == pytest.approx(-0.1, abs=1e-3), "the measurements alone"
    rest = astuple(CalibrationSums.of(stale[:5]))
    noise = astuple(CalibrationSums(m2=stale[5].m2_log_speedup, dof=stale[5].weight - 1.0))
    assert astuple(CalibrationSums.of(retired)) == pytest.approx([a + b for a, b in zip(rest, noise)]), \
        "its spread still counts toward the noise, nothing else"
    # the KB's running sums (kept up to date with every change) agree with the sums over its scores
    store = KBStore.open(tmp_path / "kb.json")
    with store.transaction() as tx:
        for score in retired:
            tx.put_score(score)
    with store.read() as view:
        assert view.calibration_sums() == pytest.approx(astuple(CalibrationSums.of(retired)))


def test_influence_band_is_centred_on_the_estimate_and_never_too_narrow() -> None:
    score = _measured("x", 1.5, n=50, spread=0.01)
    lo, hi = influence_band(score)
    centre = posterior(score).mean
    assert lo < centre < hi and hi - lo >= 2 * 3 * 0.2 - 1e-9
