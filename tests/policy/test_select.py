"""Weighted random top-k: frequencies follow the scores, untried entries are still drawn, draws are
distinct, temperature 0 is greedy, and a seed reproduces the draw."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from kb_mcp.kb.models import Score
from kb_mcp.policy.select import selection_probabilities, select_top_k, utility


def _measured(opt: str, speedup: float, n: int = 10, failures: int = 0) -> Score:
    return Score(
        state_id="s", optimization_id=opt, samples=n, attempts=n + failures, verify_failures=failures,
        mean_log_speedup=math.log(speedup), prior=False, prior_mean_log_speedup=0.0, prior_weight=1.0,
    )


def _untried(opt: str, prior_speedup: float = 1.0) -> Score:
    return Score(state_id="s", optimization_id=opt, prior_mean_log_speedup=math.log(prior_speedup), prior_weight=1.0)


POOL = [_measured("a_best", 2.0), _measured("b_good", 1.5), _measured("c_meh", 1.1), _measured("d_bad", 0.8), _untried("e_new")]


def test_higher_scores_are_drawn_more_often_and_untried_still_drawn() -> None:
    rng = random.Random(7)
    firsts: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    for _ in range(4000):
        picks = select_top_k(POOL, 2, temperature=0.3, rng=rng)
        firsts[picks[0].optimization_id] += 1
        anywhere.update(p.optimization_id for p in picks)
    assert firsts["a_best"] > firsts["b_good"] > firsts["c_meh"] > firsts["d_bad"]
    assert anywhere["e_new"] > 100, "an untried entry must keep being explored"
    # first-draw frequencies match the softmax probabilities
    probs = dict(zip((s.optimization_id for s in POOL), selection_probabilities(POOL, 0.3)))
    for opt, p in probs.items():
        assert firsts[opt] / 4000 == pytest.approx(p, abs=0.03)


def test_k_distinct_results_and_exclusions() -> None:
    rng = random.Random(3)
    for _ in range(200):
        picks = select_top_k(POOL, 4, temperature=1.0, rng=rng, exclude=["a_best"])
        ids = [p.optimization_id for p in picks]
        assert len(ids) == len(set(ids)) == 4
        assert "a_best" not in ids
    assert len(select_top_k(POOL, 10, rng=1)) == len(POOL)
    assert select_top_k(POOL, 0, rng=1) == []
    assert select_top_k([], 3, rng=1) == []


def test_temperature_zero_is_greedy_and_low_temperature_converges() -> None:
    ranked = sorted(POOL, key=lambda s: -utility(s))
    for seed in range(20):
        picks = select_top_k(POOL, 3, temperature=0.0, rng=seed)
        assert [p.optimization_id for p in picks] == [s.optimization_id for s in ranked[:3]]
    probs = selection_probabilities(POOL, 0.0)
    assert probs[0] == 1.0 and sum(probs) == 1.0
    cold = selection_probabilities(POOL, 0.01)
    assert cold[0] > 0.999


def test_same_seed_same_draw() -> None:
    a = [s.optimization_id for s in select_top_k(POOL, 3, 0.5, rng=42)]
    b = [s.optimization_id for s in select_top_k(POOL, 3, 0.5, rng=42)]
    assert a == b
    draws = {tuple(s.optimization_id for s in select_top_k(POOL, 3, 0.5, rng=seed)) for seed in range(30)}
    assert len(draws) > 1


def test_utility_rewards_speed_penalizes_failures_and_is_optimistic_for_untried() -> None:
    assert utility(_measured("x", 2.0)) > utility(_measured("x", 1.2))
    assert utility(_measured("x", 1.5, n=5, failures=10)) < utility(_measured("x", 1.5, n=5))
    # an untried entry with a neutral prior beats a measured neutral one (optimism) ...
    assert utility(_untried("x", 1.0)) > utility(_measured("y", 1.0))
    # ... but not a clearly measured winner
    assert utility(_untried("x", 1.0)) < utility(_measured("y", 1.5))
