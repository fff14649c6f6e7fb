"""The numeric update: exact statistics below the bounds, and the bounds themselves (influence per
outcome, weight per client and in total, change detection), checked against direct computation."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from kb_mcp.kb.models import Score, Verdict, utcnow
from kb_mcp.kb.tables import decode_score, encode_score
from kb_mcp.policy.select import Calibration, influence_band
from kb_mcp.policy.update import (
    CLIENT_MAX_WEIGHT,
    MAX_CREDITED_SPEEDUP,
    MAX_WEIGHT,
    RETIRE_WEIGHT,
    TRACK_ALARM,
    apply_outcome,
    empty_like,
    merge_scores,
    subtract_scores,
    track_alarm_after,
    track_alarmed,
)
from kb_mcp.policy.update import influence_band as update_band

WIDE = (-50.0, 50.0)  # a band that clips nothing


def _fresh(prior: float = 0.2) -> Score:
    return Score(state_id="s", optimization_id="o", arch="hopper", prior_mean_log_speedup=prior, prior_weight=1.0)


def _run(score: Score, events: list[tuple[Verdict, float | None]], client: str = "a",
         band: tuple[float, float] | None = WIDE) -> Score:
    for verdict, speedup in events:
        score = apply_outcome(score, verdict, speedup, client=client, band=band)
    return score


def test_statistics_match_direct_computation_below_the_bounds_and_counts_by_verdict() -> None:
    rng = random.Random(5)
    speedups = {c: [math.exp(rng.gauss(0.1, 0.4)) for _ in range(4)] for c in ("a", "b", "c")}
    s = _fresh()
    for i in range(4):
        for c, xs in speedups.items():
            s = apply_outcome(s, Verdict.faster if xs[i] > 1 else Verdict.slower, xs[i], client=c, band=WIDE)
    s = _run(s, [(Verdict.compile_error, None)] * 3 + [(Verdict.incorrect, None), (Verdict.invalid, None),
                                                       (Verdict.timeout, None), (Verdict.crashed, None),
                                                       (Verdict.needs_gpu, None)], client="d")
    logs = [math.log(x) for xs in speedups.values() for x in xs]
    assert (s.samples, s.attempts) == (12, 12 + 3 + 4)  # needs_gpu is no attempt
    assert s.successes == sum(1 for xs in speedups.values() for x in xs if x > 1)
    assert (s.compile_failures, s.verify_failures) == (3, 4)
    assert s.weight == 12.0
    # the failure rate's evidence is bounded like the mean's: 12 valid and 7 failed, scaled to the cap
    assert s.ok_weight + s.fail_weight == pytest.approx(MAX_WEIGHT)
    assert s.ok_weight > s.fail_weight > 7 * MAX_WEIGHT / 19
    assert s.mean_log_speedup == pytest.approx(statistics.fmean(logs), rel=1e-12)
    assert s.variance == pytest.approx(statistics.variance(logs), rel=1e-9)
    assert set(s.clients) == {"a", "b", "c"} and not s.prior
    # the posterior shrinks toward the prior by its weight
    assert s.expected_speedup == pytest.approx(math.exp((sum(logs) + 0.2) / 13), rel=1e-12)


def test_needs_gpu_moves_nothing_and_valid_without_speedup_is_attempt_only() -> None:
    s = _fresh()
    assert apply_outcome(s, Verdict.needs_gpu, None) == s
    t = apply_outcome(s, Verdict.faster, None)
    assert (t.attempts, t.samples, t.successes, t.ok_weight) == (1, 0, 0, 1.0)


def test_one_outcome_moves_the_mean_a_bounded_amount() -> None:
    bound = math.log(MAX_CREDITED_SPEEDUP)
    up = apply_outcome(_fresh(), Verdict.faster, 1000.0, band=WIDE)
    assert up.mean_log_speedup == pytest.approx(bound), "the 8x cap holds whatever the band"
    # the default band: the score's estimate +- 3 x max(0.2, sd)
    clipped = apply_outcome(_fresh(0.2), Verdict.faster, 1000.0)
    assert clipped.mean_log_speedup == pytest.approx(0.2 + 0.6)
    settled = _run(_fresh(0.0), [(Verdict.faster, math.exp(0.1 * (-1) ** i)) for i in range(6)], band=None)
    before = settled.mean_log_speedup
    hit = apply_outcome(settled, Verdict.faster, 1000.0)
    # sd 0.1 < 0.2: the floor sets the band, +-0.6 around the estimate (about 0)
    assert hit.mean_log_speedup - before <= (0.6 + 0.1) / (settled.weight + 1) + 1e-9
    # the outcome is counted (samples, successes) even when its value is bounded
    assert (hit.samples, hit.successes) == (7, 4)


def test_no_client_holds_more_than_its_share_and_the_total_is_capped() -> None:
    s = _run(_fresh(), [(Verdict.faster, 2.0)] * 30, client="flood")
    assert s.samples == 30 and s.clients["flood"][0] == pytest.approx(CLIENT_MAX_WEIGHT)
    assert s.weight == pytest.approx(CLIENT_MAX_WEIGHT)
    # a second client's samples are not discounted by the first one's flood
    s = _run(s, [(Verdict.faster, 1.5)] * 3, client="other")
    assert s.clients["other"][0] == pytest.approx(3.0) and s.clients["other"][1] == pytest.approx(math.log(1.5))
    expected = (CLIENT_MAX_WEIGHT * math.log(2) + 3 * math.log(1.5)) / (CLIENT_MAX_WEIGHT + 3)
    assert s.mean_log_speedup == pytest.approx(expected)
    for c in "bcde":
        s = _run(s, [(Verdict.faster, 1.2)] * 8, client=c)
    assert s.weight == pytest.approx(MAX_WEIGHT)
    assert sum(v[0] for v in s.clients.values()) == pytest.approx(MAX_WEIGHT)


def test_a_change_is_followed_within_a_few_outcomes_while_a_lone_outlier_stays_bounded() -> None:
    settled = _run(_fresh(0.5), [(Verdict.faster, math.exp(0.5 + 0.05 * (-1) ** i)) for i in range(8)], band=None)
    assert settled.mean_log_speedup == pytest.approx(0.5, abs=0.01)
    lone = apply_outcome(settled, Verdict.slower, math.exp(-2.0))
    assert lone.mean_log_speedup > 0.3, "one outlier moves the estimate a bounded amount"
    back = _run(lone, [(Verdict.faster, math.exp(0.5))] * 3, band=None)
    assert back.mean_log_speedup > 0.3 and back.clients["a"][0] == pytest.approx(CLIENT_MAX_WEIGHT)
    changed = _run(settled, [(Verdict.slower, math.exp(-1.0))] * 3, band=None)
    assert changed.mean_log_speedup < -0.5, "the truth changed: the estimate follows within three outcomes"
    assert changed.samples == 11


def test_a_change_from_a_measured_estimate_retires_the_prior_and_an_early_contradiction_does_not() -> None:
    settled = _run(_fresh(0.5), [(Verdict.faster, math.exp(0.5 + 0.05 * (-1) ** i)) for i in range(8)], band=None)
    assert settled.weight >= RETIRE_WEIGHT and settled.prior_weight == 1.0
    changed = _run(settled, [(Verdict.slower, math.exp(-1.0))] * 3, band=None)
    assert changed.prior_weight == 0.0, "the prior predicted the old truth; it says nothing about the new one"
    assert changed.prior_mean_log_speedup == 0.5, "the prior's mean is kept (it is what was believed)"
    # the same outcomes against an estimate still made of the prior say the prior was wrong (which the
    # calibration must see), not that the truth moved: the prior keeps its say
    wrong = _run(_fresh(0.5), [(Verdict.slower, math.exp(-1.0))] * 3, band=None)
    assert wrong.mean_log_speedup < -0.5 and wrong.prior_weight == 1.0
    lone = apply_outcome(settled, Verdict.slower, math.exp(-2.0))
    assert lone.prior_weight == 1.0, "a lone outlier retires nothing"
    # measurements that had already left the prior, and a change that goes their way: the prior was
    # wrong from the start (the calibration learns from that), not outdated
    left = _run(_fresh(0.5), [(Verdict.slower, math.exp(-0.5))] * 6, band=None)
    further = _run(left, [(Verdict.slower, math.exp(-1.2))] * 3, band=None)
    assert further.mean_log_speedup < -1.0 and further.prior_weight == 1.0


NOISE = 0.27  # one outcome's spread around its truth in bench/learning_sim.py (measurement and problem)


def _noisy(score: Score, truth: float, n: int, rng: random.Random) -> Score:
    """`score` after n outcomes drawn around `truth`, each within the band `record_outcome` passes."""
    for _ in range(n):
        x = rng.gauss(truth, NOISE)
        band = influence_band(score, Calibration())
        score = apply_outcome(score, Verdict.faster if x > 0 else Verdict.slower, math.exp(x), client="a", band=band)
    return score


def test_a_score_whose_truth_drops_two_spreads_is_back_near_the_new_truth_within_six_outcomes() -> None:
    errors = []
    for seed in range(40):
        rng = random.Random(seed)
        settled = _noisy(_fresh(0.4), 0.4, 30, rng)
        errors.append(_noisy(settled, -0.15, 6, rng).posterior_mean_log_speedup + 0.15)
    # with every sample at full weight the mean would still sit 30/36 of the way back at 0.4 (+0.46)
    assert statistics.fmean(errors) < 0.12, statistics.fmean(errors)
    assert sum(e < 0.2 for e in errors) >= 30, sorted(errors)


def test_a_stationary_score_is_not_reset_by_noise() -> None:
    resets = outcomes = 0
    for seed in range(10):
        rng = random.Random(f"still-{seed}")
        score = _noisy(_fresh(0.3), 0.3, 20, rng)
        for _ in range(200):
            before = score.weight
            score = _noisy(score, 0.3, 1, rng)
            resets += score.weight < before - 0.5  # a detected change keeps only the run that showed it
            outcomes += 1
        assert abs(score.mean_log_speedup - 0.3) < 0.25
    assert resets <= 0.005 * outcomes, resets


def test_another_clients_outliers_never_discount_a_clients_samples() -> None:
    settled = _run(_fresh(0.5), [(Verdict.faster, math.exp(0.5 + 0.05 * (-1) ** i)) for i in range(8)], band=None)
    hit = _run(settled, [(Verdict.slower, math.exp(-2.0))] * 4, client="mallory", band=None)
    assert hit.clients["a"] == settled.clients["a"]
    assert hit.clients["mallory"][0] <= 4.0


def test_merge_equals_statistics_of_the_union_below_the_bounds() -> None:
    rng = random.Random(11)
    xs = [math.exp(rng.gauss(0.3, 0.5)) for _ in range(6)]
    ys = [math.exp(rng.gauss(-0.1, 0.2)) for _ in range(5)]
    a = _run(_fresh(), [(Verdict.faster, x) for x in xs] + [(Verdict.compile_error, None)], client="a")
    b = _run(_fresh(0.9), [(Verdict.slower, y) for y in ys] + [(Verdict.incorrect, None)] * 2, client="b")
    m = merge_scores(a, b)
    logs = [math.log(v) for v in xs + ys]
    assert (m.samples, m.attempts, m.compile_failures, m.verify_failures) == (11, 14, 1, 2)
    assert m.mean_log_speedup == pytest.approx(statistics.fmean(logs), rel=1e-12)
    assert m.variance == pytest.approx(statistics.variance(logs), rel=1e-9)
    assert m.prior_mean_log_speedup == 0.2, "the prior stays the receiving side's, never pooled"
    m2 = merge_scores(b, a)
    assert m2.mean_log_speedup == pytest.approx(m.mean_log_speedup)
    assert m2.m2_log_speedup == pytest.approx(m.m2_log_speedup)
    e = merge_scores(a, empty_like(b))
    assert (e.samples, e.mean_log_speedup, e.m2_log_speedup) == (a.samples, a.mean_log_speedup, a.m2_log_speedup)


def test_subtract_inverts_merge() -> None:
    rng = random.Random(2)
    a = _run(_fresh(), [(Verdict.faster, math.exp(rng.gauss(0.2, 0.3))) for _ in range(6)] + [(Verdict.crashed, None)],
             client="a")
    b = _run(_fresh(), [(Verdict.slower, math.exp(rng.gauss(-0.2, 0.3))) for _ in range(5)], client="b")
    back = subtract_scores(merge_scores(a, b), b)
    assert (back.samples, back.attempts, back.verify_failures) == (a.samples, a.attempts, a.verify_failures)
    assert back.mean_log_speedup == pytest.approx(a.mean_log_speedup, rel=1e-9)
    assert back.m2_log_speedup == pytest.approx(a.m2_log_speedup, rel=1e-7)
    gone = subtract_scores(a, a)
    assert (gone.samples, gone.attempts, gone.mean_log_speedup, gone.m2_log_speedup,
            gone.weight) == (0, 0, 0.0, 0.0, 0.0)
    assert gone.prior


def test_one_clients_failures_discount_only_its_own_attempts_never_other_clients_successes() -> None:
    s = _fresh()
    for i in range(8):  # eight clients each verified one kernel
        s = apply_outcome(s, Verdict.faster, 1.6, client=f"honest{i}", band=WIDE)
    s = apply_outcome(s, Verdict.faster, 1.6, client="noisy", band=WIDE)
    s = _run(s, [(Verdict.compile_error, None)] * 40, client="noisy")
    assert s.compile_failures == 40
    assert sum(s.rates["noisy"]) == pytest.approx(CLIENT_MAX_WEIGHT)  # its own earlier attempts gave way
    assert s.rates["noisy"][0] < 0.05, "its own success is discounted by its failures"
    # the eight successes keep their weight: the failures hold at most a client's share
    assert s.ok_weight > s.fail_weight == pytest.approx(CLIENT_MAX_WEIGHT, abs=0.05)
    assert s.ok_weight + s.fail_weight == pytest.approx(MAX_WEIGHT)
    assert all(s.rates[f"honest{i}"][0] == pytest.approx(s.rates["honest0"][0]) for i in range(8))


def test_rates_merge_and_subtract_per_client() -> None:
    a = _run(_fresh(), [(Verdict.faster, 1.5), (Verdict.compile_error, None)], client="a")
    b = _run(_fresh(), [(Verdict.incorrect, None)] * 3, client="b")
    both = merge_scores(a, b)
    assert both.rates == {"a": [1.0, 1.0], "b": [0.0, 3.0]} and (both.ok_weight, both.fail_weight) == (1.0, 4.0)
    back = subtract_scores(both, b)
    assert back.rates == {"a": [1.0, 1.0]} and (back.ok_weight, back.fail_weight) == (1.0, 1.0)


def test_a_score_written_before_rates_were_kept_per_client_holds_them_as_one_unnamed_clients() -> None:
    old = Score.model_validate({"state_id": "s", "optimization_id": "o", "samples": 4, "attempts": 7,
                                "compile_failures": 3, "weight": 4.0, "ok_weight": 4.0, "fail_weight": 3.0,
                                "clients": {"": [4.0, 0.3, 0.1]}, "prior": False})
    assert old.rates == {"": [4.0, 3.0]}
    row = encode_score(old)[1]
    assert row is not None
    doc = {"state_id": "s", "arch": "*", "updated_at": utcnow().isoformat(), "priors": {"o": [0.0, 1.0]},
           "stats": {"o": row[:13]}}  # a row written before the rates
    decoded = decode_score("s", "*", "o", doc)
    assert decoded is not None and decoded.rates == {"": [4.0, 3.0]}
    doc["stats"]["o"] = row
    again = decode_score("s", "*", "o", doc)
    assert again is not None and again.rates == old.rates
    new = apply_outcome(old, Verdict.compile_error, None, client="a", band=WIDE)
    assert new.rates == {"": [4.0, 3.0], "a": [0.0, 1.0]} and new.fail_weight == 4.0


def test_a_score_written_before_weights_existed_counts_every_outcome_once() -> None:
    old = Score.model_validate({"state_id": "s", "optimization_id": "o", "mean_log_speedup": 0.4, "m2_log_speedup": 0.9,
                                "samples": 10, "attempts": 13, "compile_failures": 2, "verify_failures": 1,
                                "prior": False})
    assert (old.weight, old.ok_weight, old.fail_weight) == (10.0, 10.0, 3.0)
    assert old.clients == {"": [10.0, 0.4, 0.9]} and old.variance == pytest.approx(0.1)
    new = apply_outcome(old, Verdict.faster, math.exp(0.4), client="a", band=WIDE)
    assert new.clients[""][0] == pytest.approx(CLIENT_MAX_WEIGHT), "the unnamed history is bounded like any client's"
    assert new.samples == 11


def _alarm_after(outcomes: list[float], band: tuple[float, float]) -> list[float]:
    levels, level = [], 0.0
    for x in outcomes:
        level = track_alarm_after(level, x, band)
        levels.append(level)
    return levels


def test_the_track_detector_fires_on_a_track_wide_change_and_not_on_one_scores_noise() -> None:
    band = (-3 * NOISE, 3 * NOISE)  # outcomes scored against estimates at 0, one outcome's sd NOISE
    for seed in range(5):
        rng = random.Random(seed)
        quiet = _alarm_after([rng.gauss(0.0, NOISE) for _ in range(2000)], band)
        assert not any(track_alarmed(v) for v in quiet), "noise around the estimates never raises the alarm"
    lone = _alarm_after([0.0] * 10 + [-5 * NOISE] + [0.0] * 10, band)
    assert max(lone) < TRACK_ALARM, "one score's outlier alone does not either"
    for seed in range(5):
        rng = random.Random(seed)
        moved = _alarm_after([rng.gauss(-3 * NOISE, NOISE) for _ in range(6)], band)
        assert track_alarmed(moved[-1]), "many scores 3 sd below their estimates at once: the alarm is up"
    fading = _alarm_after([-3 * NOISE] * 6 + [0.0] * 40, band)
    assert track_alarmed(fading[10]) and not track_alarmed(fading[-1]), "and it fades once outcomes stop surprising"


def test_an_alarmed_track_follows_a_fall_from_one_outcome_and_a_rise_as_before() -> None:
    rng = random.Random(3)
    settled = _run(_fresh(0.5), [(Verdict.faster, math.exp(rng.gauss(0.5, NOISE))) for _ in range(8)], band=None)
    lo, hi = update_band(settled)  # the band apply_outcome scores outcomes against by default
    sd = (hi - lo) / 6.0
    fall = math.exp(settled.mean_log_speedup - 3.2 * sd)
    quiet = apply_outcome(settled, Verdict.faster, fall, client="a")
    alarmed = apply_outcome(settled, Verdict.faster, fall, client="a", alarmed=True)
    assert quiet.weight == pytest.approx(CLIENT_MAX_WEIGHT) and quiet.run is not None, "one fall: a bounded step"
    assert alarmed.weight == pytest.approx(1.0) and alarmed.run is None, "alarmed: the fall is a change"
    assert alarmed.mean_log_speedup == pytest.approx(math.log(fall))
    rise = math.exp(settled.mean_log_speedup + 3.2 * sd)
    up = apply_outcome(settled, Verdict.faster, rise, client="a", alarmed=True)
    assert up.weight == pytest.approx(CLIENT_MAX_WEIGHT), "a rise is found by drawing it: no reset on one outcome"


def _from_slow_starts(truth: float, n: int, seed: int, *, slowness: float = 3.0, capped: bool = False) -> Score:
    """A score after n honest outcomes of lineages that start `slowness` times slower than the
    reference: real gains around `truth`, credited as the shipped rule credits them (the speedup over
    the parent, trusted as far as the candidate's speedup over the reference) or, `capped`, as the
    rule before did (the parent counted as the reference)."""
    rng, score = random.Random(seed), _fresh(0.3)
    for _ in range(n):
        x = rng.gauss(truth, NOISE)
        gained, over_reference = math.exp(x), math.exp(x) / slowness
        band = influence_band(score, Calibration())
        speedup, trusted = (over_reference, None) if capped else (gained, over_reference)
        score = apply_outcome(score, Verdict.faster if speedup > 1 else Verdict.slower, speedup, client="a",
                              band=band, trusted=trusted)
    return score


def test_honest_lineages_that_start_slow_learn_their_real_gains() -> None:
    truths = (0.7, 0.3, -0.2)
    learnt = {t: statistics.fmean(_from_slow_starts(t, 40, s).posterior_mean_log_speedup for s in range(10))
              for t in truths}
    capped = {t: statistics.fmean(_from_slow_starts(t, 40, s, capped=True).posterior_mean_log_speedup
                                  for s in range(10)) for t in truths}
    assert learnt[0.7] > learnt[0.3] > learnt[-0.2], learnt
    for t in truths:
        # what rests on the slow start counts up to half a deviation above the estimate: a small
        # downward lean (about 0.1), where counting the parent as the reference lost log 3 (1.1)
        assert t - 0.25 < learnt[t] < t + 0.1, (t, learnt[t])
        assert capped[t] < t - 0.8, (t, capped[t])


def test_what_a_deliberately_slow_start_claims_lifts_a_score_only_a_little() -> None:
    # a client verifies a parent 10x slower than the reference, then records an ordinary candidate (0.8x
    # of the reference) against it: it claims 8x, of which 0.8x rests on no choice of its own
    sandbagged = _run(_fresh(0.0), [(Verdict.faster, 8.0)] * 4, client="mallory", band=None)
    held = _fresh(0.0)
    for _ in range(4):
        held = apply_outcome(held, Verdict.faster, 8.0, client="mallory", trusted=0.8)
    assert sandbagged.posterior_mean_log_speedup > 1.0, "trusted in full, four records make it a 3x optimization"
    assert held.posterior_mean_log_speedup < 0.15, held.posterior_mean_log_speedup
    assert held.samples == 4 and held.weight == pytest.approx(4.0)
    # change detection sees the claims as the score holds them, within its allowance: no run builds up
    assert held.run is None or abs(held.run.cusum) < 1e-9, held.run
    # what it measured over the reference is never held below (within the band, +-0.6 here): a
    # candidate 1.5x faster than the reference counts as 1.5x whatever its start
    fast = apply_outcome(_fresh(0.0), Verdict.faster, 8.0, client="a", trusted=1.5)
    assert fast.mean_log_speedup == pytest.approx(math.log(1.5))


def test_an_outcome_of_reduced_weight_counts_as_that_share_and_calls_no_change() -> None:
    settled = _run(_fresh(0.5), [(Verdict.faster, math.exp(0.5 + 0.05 * (-1) ** i)) for i in range(8)], band=None)
    full = apply_outcome(settled, Verdict.faster, math.exp(1.0), client="b", band=WIDE)
    tenth = apply_outcome(settled, Verdict.faster, math.exp(1.0), client="b", band=WIDE, weight=0.1)
    assert tenth.clients["b"][0] == pytest.approx(0.1) and tenth.samples == full.samples
    lift_full, lift_tenth = (s.mean_log_speedup - settled.mean_log_speedup for s in (full, tenth))
    assert lift_tenth == pytest.approx(lift_full * 0.1 * 9 / 8.1)  # 0.1 / 8.1 of the way against 1 / 9
    # far-off outcomes of reduced weight never call a change (which would replace the client's samples)
    far = _run(settled, [], band=None)
    for _ in range(6):
        far = apply_outcome(far, Verdict.slower, math.exp(-1.5), client="a", weight=0.5)
    assert far.run is None and far.clients["a"][0] == pytest.approx(CLIENT_MAX_WEIGHT)
    assert far.mean_log_speedup > 0.0
