"""The numeric update and the pooling of Scores, checked against statistics computed directly."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from kb_mcp.kb.models import Score, Verdict
from kb_mcp.policy.update import MAX_CREDITED_SPEEDUP, apply_outcome, empty_like, merge_scores, subtract_scores


def _fresh() -> Score:
    return Score(state_id="s", optimization_id="o", arch="hopper", prior_mean_log_speedup=0.2, prior_weight=1.0)


def _run(score: Score, events: list[tuple[Verdict, float | None]]) -> Score:
    for verdict, speedup in events:
        score = apply_outcome(score, verdict, speedup)
    return score


def test_welford_matches_direct_statistics_and_counts_by_verdict() -> None:
    rng = random.Random(5)
    speedups = [math.exp(rng.gauss(0.1, 0.4)) for _ in range(50)]
    events: list[tuple[Verdict, float | None]] = [(Verdict.faster if s > 1 else Verdict.slower, s) for s in speedups]
    events += [(Verdict.compile_error, None)] * 3 + [(Verdict.incorrect, None)] * 2 + [(Verdict.invalid, None)]
    events += [(Verdict.timeout, None), (Verdict.crashed, None), (Verdict.needs_gpu, None)]
    rng.shuffle(events)
    s = _run(_fresh(), events)
    logs = [math.log(x) for x in speedups]
    assert s.samples == 50
    assert s.attempts == 50 + 3 + 3 + 2  # needs_gpu is no attempt
    assert s.successes == sum(1 for x in speedups if x > 1)
    assert (s.compile_failures, s.verify_failures) == (3, 5)
    assert s.mean_log_speedup == pytest.approx(statistics.fmean(logs), rel=1e-12)
    assert s.variance == pytest.approx(statistics.variance(logs), rel=1e-9)
    assert not s.prior
    # the posterior shrinks toward the prior by one pseudo-sample
    assert s.expected_speedup == pytest.approx(math.exp((sum(logs) + 0.2) / 51), rel=1e-12)


def test_needs_gpu_moves_nothing_and_valid_without_speedup_is_attempt_only() -> None:
    s = _fresh()
    assert apply_outcome(s, Verdict.needs_gpu, None) == s
    t = apply_outcome(s, Verdict.faster, None)
    assert (t.attempts, t.samples, t.successes) == (1, 0, 0)


def test_one_outcome_moves_the_mean_a_bounded_amount() -> None:
    bound = math.log(MAX_CREDITED_SPEEDUP)
    up = apply_outcome(_fresh(), Verdict.faster, 1000.0)
    down = apply_outcome(_fresh(), Verdict.slower, 1 / 1000.0)
    assert up.mean_log_speedup == pytest.approx(bound) and down.mean_log_speedup == pytest.approx(-bound)
    inside = apply_outcome(_fresh(), Verdict.faster, MAX_CREDITED_SPEEDUP * 0.99)
    assert inside.mean_log_speedup == pytest.approx(math.log(MAX_CREDITED_SPEEDUP * 0.99))
    assert (up.samples, up.successes, down.successes) == (1, 1, 0)


def test_merge_equals_statistics_of_the_union() -> None:
    rng = random.Random(11)
    xs = [math.exp(rng.gauss(0.3, 0.5)) for _ in range(17)]
    ys = [math.exp(rng.gauss(-0.1, 0.2)) for _ in range(9)]
    a = _run(_fresh(), [(Verdict.faster, x) for x in xs] + [(Verdict.compile_error, None)])
    b = _run(_fresh().model_copy(update={"prior_mean_log_speedup": 0.9}), [(Verdict.slower, y) for y in ys] + [(Verdict.incorrect, None)] * 2)
    both = _run(_fresh(), [(Verdict.faster, x) for x in xs + ys] + [(Verdict.compile_error, None)] + [(Verdict.incorrect, None)] * 2)
    m = merge_scores(a, b)
    assert (m.samples, m.attempts, m.successes, m.compile_failures, m.verify_failures) == (
        both.samples, both.attempts, both.successes, both.compile_failures, both.verify_failures)
    assert m.mean_log_speedup == pytest.approx(both.mean_log_speedup, rel=1e-12)
    assert m.m2_log_speedup == pytest.approx(both.m2_log_speedup, rel=1e-9)
    assert m.prior_mean_log_speedup == 0.2, "the prior stays the receiving side's, never pooled"
    # merging is symmetric in the statistics
    m2 = merge_scores(b, a)
    assert m2.mean_log_speedup == pytest.approx(m.mean_log_speedup) and m2.m2_log_speedup == pytest.approx(m.m2_log_speedup)
    # pooling with an empty score changes nothing
    e = merge_scores(a, empty_like(b))
    assert (e.samples, e.mean_log_speedup, e.m2_log_speedup) == (a.samples, a.mean_log_speedup, a.m2_log_speedup)


def test_subtract_inverts_merge() -> None:
    rng = random.Random(2)
    a = _run(_fresh(), [(Verdict.faster, math.exp(rng.gauss(0.2, 0.3))) for _ in range(12)] + [(Verdict.crashed, None)])
    b = _run(_fresh(), [(Verdict.slower, math.exp(rng.gauss(-0.2, 0.3))) for _ in range(5)])
    back = subtract_scores(merge_scores(a, b), b)
    assert (back.samples, back.attempts, back.verify_failures) == (a.samples, a.attempts, a.verify_failures)
    assert back.mean_log_speedup == pytest.approx(a.mean_log_speedup, rel=1e-9)
    assert back.m2_log_speedup == pytest.approx(a.m2_log_speedup, rel=1e-7)
    gone = subtract_scores(a, a)
    assert (gone.samples, gone.attempts, gone.mean_log_speedup, gone.m2_log_speedup) == (0, 0, 0.0, 0.0)
    assert gone.prior
