"""The numeric update: how one measured outcome moves a Score, and how two Scores pool.

Speedups are tracked as log-speedups with a weighted Welford mean and sum of squared deviations
(M2), kept per client and pooled exactly over clients (Chan et al.'s parallel combination), so a
2x gain and a 0.5x loss cancel and merging two KB files pools their statistics. Counters:

* `attempts`: every recorded outcome except `needs_gpu` (the candidate was never run, so it says
  nothing about the optimization);
* `samples`: outcomes with a valid timed verdict (faster/slower) and a speedup;
* `successes`: samples with speedup > 1 (faster than the kernel the optimization started from);
* `compile_failures`: compile_error; `verify_failures`: incorrect, invalid, timeout, crashed.

What one outcome may do to the statistics is bounded, because the speedup's basis and the
optimization it is credited to are the caller's claims:

* **Bounded influence.** The credited log-speedup is clipped to ±log(MAX_CREDITED_SPEEDUP), then to
  a band around the score's current estimate, INFLUENCE_SDS predictive standard deviations wide
  (never less than MIN_SD; `record_outcome` passes the band of the selection's calibrated posterior,
  `policy.select.influence_band`). One record moves a score of weight W by at most the band's
  half-width / (W + 1), however extreme it is.
* **What rests on a slow start climbs slowly.** A credit whose parent was slower than the reference
  (`policy.credit`) is trusted as far as the candidate's speedup over the reference; what it claims
  beyond that counts at most START_SDS predictive deviations above the estimate (`start_ceiling`),
  for the score and its change detection alike. An outcome weighing less than one sample (a start
  far slower than the reference) counts as that share and calls no change.
* **Changes are detected.** Consecutive outcomes of one client on one side of the estimate are
  summed (a one-sided CUSUM, `Score.run`); past CHANGE_THRESHOLD the truth has likely changed, and
  that client's older samples give way to the run: two outliers in a row, or a few outcomes well
  off on one side, and the estimate follows. A lone outlier stays bounded.
* **Many changes at once are noticed.** A new GPU, a new compiler or a bad batch moves many scores
  of a track together. The outcomes' distances from their estimates, summed over the whole track and
  arch family (a one-sided CUSUM, `track_alarm_after`; the level is kept in the KB's meta record),
  rise past TRACK_ALARM when many scores surprise at once; while they do, a score's own detector
  calls a fall at ALARMED_THRESHOLD instead of CHANGE_THRESHOLD (one outcome 3 sd below), so the
  changed scores are relearnt from their first outcomes. Only falls: a good optimization's change
  upward is found by drawing it, a bad one's fall costs every draw until it is seen.
* **No client dominates.** Each client's samples carry at most CLIENT_MAX_WEIGHT of weight in a
  score: beyond it, the client's own older samples are discounted, never other clients'. The same
  holds for its attempts behind the compile/verify failure rate (`Score.rates`): one client's
  failures discount its own earlier attempts, never other clients' successes.
* **Drift is followed.** The whole score carries at most MAX_WEIGHT: beyond it every sample is
  discounted, so the estimate follows the latest ~MAX_WEIGHT outcomes (a new GPU, a new compiler).
  The same cap applies to the compile/verify failure rate (`ok_weight`, `fail_weight`).

The plain counters are never discounted: they say how much was ever measured. The outcome itself
(the replay buffer) always keeps the unclipped measurement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime

from kb_mcp.kb.models import ChangeRun, Score, Verdict, utcnow

# Honest single steps beyond this exist (fusing a long elementwise chain), but they are rare enough
# that clipping them costs little, while one unbounded sample can dominate a mean of few samples.
MAX_CREDITED_SPEEDUP = 8.0
INFLUENCE_SDS = 3.0
"""A credited log-speedup lies within this many standard deviations of the score's estimate."""
MIN_SD = 0.2
"""Floor of the spread used for that band (log units): a score with one sample, or with identical
samples, still lets a new measurement differ by 3 x 0.2 = 0.6 (x1.8) from its estimate."""
MAX_WEIGHT = 16.0
"""Effective samples a score holds at most: older ones are discounted beyond it (drift)."""
CLIENT_MAX_WEIGHT = 8.0
"""Effective samples one client holds at most in one score."""
START_SDS = 0.5
"""What a credit gains from a start slower than the reference (`policy.credit`) counts at most up to
this many standard deviations above the score's estimate: the caller chose how slow the start was,
so its records may lift a score only slowly, while an honest slow lineage, scattered around the
truth, gives up little (what lies above the estimate counts as at most half a deviation above it)."""
CHANGE_ALLOWANCE = 0.5
"""Standard deviations of each outcome's distance from the estimate that change detection ignores."""
CHANGE_THRESHOLD = 4.0
"""Accumulated standard deviations beyond the allowance that signal a change: two outliers beyond 2.5 sd
in a row, or four outcomes 1.5 sd off on one side."""
RETIRE_WEIGHT = 4.0
"""Weight of measurements a score must hold for a detected change to retire its prior as well (as
much as any prior may count for, `policy.select.MAX_PRIOR_SAMPLES`): a prior that predicted the old
truth says nothing about the new one (`_prior_outdated`)."""
CHANGE_STEP = 3.0
"""The most one outcome adds to that sum (below the threshold: a lone outlier never signals a change)."""
TRACK_ALLOWANCE = 0.8
"""Surprise per outcome (`surprise`) the track's detector ignores: about twice what outcomes show on
average when nothing changed (0.4 for a normal distance), so one score's noise keeps it near zero."""
TRACK_ALARM = 5.0
"""Surprise summed over a track and arch family beyond which many of its scores changed at once."""
TRACK_ALARM_CAP = 15.0
"""The most the track's detector holds: an alarm outlasts the surprises that raised it by ~20 outcomes."""
ALARMED_THRESHOLD = 2.5
"""CHANGE_THRESHOLD for falls while the track is alarmed: one outcome 3 sd below its estimate."""
MAX_CLIENTS = 16
"""Clients tracked per score; the lightest are pooled under UNNAMED_CLIENT beyond it."""
UNNAMED_CLIENT = ""
"""Client key of outcomes whose client gave no name (and of scores written before clients were kept)."""

COMPILE_FAILURES = frozenset({Verdict.compile_error})
VERIFY_FAILURES = frozenset({Verdict.incorrect, Verdict.invalid, Verdict.timeout, Verdict.crashed})
UNINFORMATIVE = frozenset({Verdict.needs_gpu})

Stats = tuple[float, float, float]  # (weight, mean, m2)


def counts_toward_score(verdict: Verdict) -> bool:
    """False for verdicts that say nothing about the optimization (the candidate never ran)."""
    return verdict not in UNINFORMATIVE


def clip_log_speedup(speedup: float) -> float:
    """log(speedup), clipped to ±log(MAX_CREDITED_SPEEDUP)."""
    bound = math.log(MAX_CREDITED_SPEEDUP)
    return max(-bound, min(bound, math.log(speedup)))


def influence_band(score: Score) -> tuple[float, float]:
    """The interval one new outcome's log-speedup is clipped to when the caller gives none: the
    score's own estimate ± INFLUENCE_SDS x max(MIN_SD, sd). (`record_outcome` passes the band of the
    selection's calibrated posterior, `policy.select.influence_band`.)"""
    centre = posterior_mean_log_speedup(score)
    half = INFLUENCE_SDS * max(MIN_SD, math.sqrt(max(score.variance, 0.0)))
    return centre - half, centre + half


def credited_log_speedup(speedup: float, score: Score | None = None, band: tuple[float, float] | None = None,
                         trusted: float | None = None) -> float:
    """What one outcome with this measured speedup contributes to `score` (log space, clipped; with
    `trusted` below it, what rests on a slow start held at `start_ceiling`, see `apply_outcome`)."""
    x = clip_log_speedup(speedup)
    if score is None and band is None:
        return x
    lo, hi = band if band is not None else influence_band(score)  # type: ignore[arg-type]
    return _claimed(max(lo, min(hi, x)), (lo, hi), trusted)


# ---- weighted statistics -------------------------------------------------------------------------


def _pool(a: Stats, b: Stats) -> Stats:
    wa, ma, m2a = a
    wb, mb, m2b = b
    w = wa + wb
    if w <= 0:
        return 0.0, 0.0, 0.0
    delta = mb - ma
    return w, ma + delta * wb / w, m2a + m2b + delta * delta * wa * wb / w


def _unpool(total: Stats, part: Stats) -> Stats:
    """`total` without `part` (the inverse of `_pool`); empty when nothing remains."""
    wt, mt, m2t = total
    wp, mp, m2p = part
    w = wt - wp
    if w <= 1e-9:
        return 0.0, 0.0, 0.0
    mean = (mt * wt - mp * wp) / w
    delta = mp - mean
    return w, mean, max(0.0, m2t - m2p - delta * delta * w * wp / wt)


def _scaled(stats: Stats, factor: float) -> Stats:
    w, mean, m2 = stats
    return w * factor, mean, m2 * factor


def _client_stats(score: Score) -> dict[str, Stats]:
    if score.clients:
        return {name: (float(v[0]), float(v[1]), float(v[2])) for name, v in score.clients.items()}
    if score.weight > 0:  # built by hand without clients: one unnamed client holds it all
        return {UNNAMED_CLIENT: (score.weight, score.mean_log_speedup, score.m2_log_speedup)}
    return {}


def _bounded(clients: Mapping[str, Stats]) -> dict[str, Stats]:
    """Clients capped at CLIENT_MAX_WEIGHT each and MAX_WEIGHT together; at most MAX_CLIENTS kept."""
    out = {n: (_scaled(s, CLIENT_MAX_WEIGHT / s[0]) if s[0] > CLIENT_MAX_WEIGHT else s) for n,
           s in clients.items() if s[0] > 0}
    if len(out) > MAX_CLIENTS:
        named = sorted((n for n in out if n != UNNAMED_CLIENT), key=lambda n: (-out[n][0], n))
        rest = out.get(UNNAMED_CLIENT, (0.0, 0.0, 0.0))
        for name in named[MAX_CLIENTS - 1:]:
            rest = _pool(rest, out.pop(name))
        out[UNNAMED_CLIENT] = rest
    total = sum(s[0] for s in out.values())
    if total > MAX_WEIGHT:
        out = {n: _scaled(s, MAX_WEIGHT / total) for n, s in out.items()}
    return out


def _with_clients(score: Score, clients: Mapping[str, Stats], update: dict[str, object]) -> Score:
    pooled: Stats = (0.0, 0.0, 0.0)
    for name in sorted(clients):
        pooled = _pool(pooled, clients[name])
    return score.model_copy(
        update={
            **update,
            "weight": pooled[0],
            "mean_log_speedup": pooled[1],
            "m2_log_speedup": pooled[2],
            "clients": {n: [s[0], s[1], s[2]] for n, s in sorted(clients.items())},
        }
    )


def _standardized(raw: float, lo: float, hi: float) -> float:
    centre, sd = (lo + hi) / 2.0, max((hi - lo) / (2.0 * INFLUENCE_SDS), 1e-9)
    return (raw - centre) / sd


def surprise(raw: float, lo: float, hi: float) -> float:
    """How far one measured log-speedup lies from its score's estimate, as change detection counts
    it: standard deviations of the band (`lo`, `hi`) beyond CHANGE_ALLOWANCE, at most CHANGE_STEP
    (below CHANGE_THRESHOLD: one outcome alone never signals a change)."""
    return min(CHANGE_STEP, max(0.0, abs(_standardized(raw, lo, hi)) - CHANGE_ALLOWANCE))


def track_alarm_after(level: float, raw: float, band: tuple[float, float]) -> float:
    """A track's (and arch family's) change detector after one more timed outcome, `raw` its
    log-speedup and `band` its score's influence band: a one-sided CUSUM of the outcomes' surprise
    beyond TRACK_ALLOWANCE, held at most at TRACK_ALARM_CAP. One score's outliers come and go; many
    scores surprising at once raise it past TRACK_ALARM, where it stays while they keep surprising."""
    return min(TRACK_ALARM_CAP, max(0.0, level + surprise(raw, *band) - TRACK_ALLOWANCE))


def track_alarmed(level: float) -> bool:
    """Whether a track's change detector (`track_alarm_after`) says many of its scores changed."""
    return level >= TRACK_ALARM


def _run_after(run: ChangeRun | None, client: str, raw: float, lo: float, hi: float) -> ChangeRun | None:
    """The change-detection run after one more outcome (a one-sided CUSUM in band units); None when
    the outcomes show nothing (the last one within the allowance and no run going on)."""
    z = _standardized(raw, lo, hi)
    step = surprise(raw, lo, hi)
    if run is None or run.client != client or (run.cusum > 0) != (z > 0):
        if step == 0.0:
            return None
        cusum, n, mean = 0.0, 0, 0.0  # a new run: another client, or the other side of the estimate
    else:
        cusum, n, mean = run.cusum, run.n, run.mean
    return ChangeRun(client=client, cusum=cusum + (step if z > 0 else -step), n=n + 1,
                     mean=mean + (raw - mean) / (n + 1))


def _prior_outdated(score: Score, run: ChangeRun) -> bool:
    """Whether a change just seen in `score` retires its prior: the measurements before the run were
    enough to stand on their own (RETIRE_WEIGHT) and lay nearer the prior than the run does, so the
    truth the prior predicted has moved. Where the measurements had already left the prior and the run
    goes their way, the prior was wrong from the start: it keeps its say, and the calibration learns
    from it how far such priors are to be trusted."""
    measured = score.mean_log_speedup
    return score.weight >= RETIRE_WEIGHT and abs(run.mean - measured) > abs(measured - score.prior_mean_log_speedup)


Rates = tuple[float, float]  # (ok weight, fail weight) of one client's attempts


def _client_rates(score: Score) -> dict[str, Rates]:
    if score.rates:
        return {name: (float(v[0]), float(v[1])) for name, v in score.rates.items()}
    if score.ok_weight > 0 or score.fail_weight > 0:  # built by hand without rates: one unnamed client
        return {UNNAMED_CLIENT: (score.ok_weight, score.fail_weight)}
    return {}


def _rate_scaled(rates: Rates, factor: float) -> Rates:
    return rates[0] * factor, rates[1] * factor


def _bounded_rates(rates: Mapping[str, Rates]) -> dict[str, Rates]:
    """Clients' attempts capped at CLIENT_MAX_WEIGHT each and MAX_WEIGHT together; at most MAX_CLIENTS
    kept (the lightest pooled under UNNAMED_CLIENT), as `_bounded` does for the speedup statistics."""
    out = {n: (_rate_scaled(r, CLIENT_MAX_WEIGHT / sum(r)) if sum(r) > CLIENT_MAX_WEIGHT else r)
           for n, r in rates.items() if sum(r) > 0}
    if len(out) > MAX_CLIENTS:
        named = sorted((n for n in out if n != UNNAMED_CLIENT), key=lambda n: (-sum(out[n]), n))
        rest = out.get(UNNAMED_CLIENT, (0.0, 0.0))
        for name in named[MAX_CLIENTS - 1:]:
            gone = out.pop(name)
            rest = (rest[0] + gone[0], rest[1] + gone[1])
        out[UNNAMED_CLIENT] = rest
    total = sum(sum(r) for r in out.values())
    if total > MAX_WEIGHT:
        out = {n: _rate_scaled(r, MAX_WEIGHT / total) for n, r in out.items()}
    return out


def _rates_update(rates: Mapping[str, Rates]) -> dict[str, object]:
    """The Score fields of these per-client rates: the rates and their totals."""
    return {
        "rates": {n: [r[0], r[1]] for n, r in sorted(rates.items())},
        "ok_weight": sum(r[0] for r in rates.values()),
        "fail_weight": sum(r[1] for r in rates.values()),
    }


def _attempted(rates: dict[str, Rates], client: str, ok: bool) -> dict[str, Rates]:
    """`rates` after one more attempt by `client`: beyond CLIENT_MAX_WEIGHT its own earlier attempts
    are discounted to make room, never another client's."""
    own = rates.get(client, (0.0, 0.0))
    if sum(own) + 1.0 > CLIENT_MAX_WEIGHT:
        own = _rate_scaled(own, max(0.0, CLIENT_MAX_WEIGHT - 1.0) / sum(own))
    rates[client] = (own[0] + 1.0, own[1]) if ok else (own[0], own[1] + 1.0)
    return _bounded_rates(rates)


# ---- the update -----------------------------------------------------------------------------------


def start_ceiling(band: tuple[float, float]) -> float:
    """The most the part of a credit resting on a start slower than the reference counts (log
    units): the estimate plus START_SDS of the band's standard deviations."""
    lo, hi = band
    return (lo + hi) / 2.0 + START_SDS * (hi - lo) / (2.0 * INFLUENCE_SDS)


def _claimed(raw: float, band: tuple[float, float], trusted: float | None) -> float:
    """`raw` (a clipped log-speedup) with what rests on the caller's choice of start held at
    `start_ceiling`, but never below the `trusted` speedup's clipped log (None: all of it is trusted)."""
    if trusted is None or trusted <= 0:
        return raw
    return min(raw, max(start_ceiling(band), clip_log_speedup(trusted)))


def detected_log_speedup(speedup: float, band: tuple[float, float], trusted: float | None = None) -> float:
    """The log-speedup change detection sees for one outcome (a score's own and the track's): the
    measurement clipped to ±log(MAX_CREDITED_SPEEDUP), and, for a credit that rests in part on a
    start slower than the reference (`trusted`, the speedup over the reference, below it: see
    `policy.credit.Credit`), held as the score holds it: the caller chose that start, so its claims
    may not call a change that the credit itself would not make."""
    return _claimed(clip_log_speedup(speedup), band, trusted)


def apply_outcome(
    score: Score, verdict: Verdict, speedup: float | None, when: datetime | None = None, *,
    client: str = UNNAMED_CLIENT, band: tuple[float, float] | None = None, alarmed: bool = False,
    weight: float = 1.0, trusted: float | None = None,
) -> Score:
    """`score` after one outcome with this verdict and (for valid verdicts) measured speedup,
    recorded by `client`; `band` bounds the credited log-speedup (default: `influence_band`).
    `alarmed`: many scores of its track changed lately (`track_alarmed`), so a smaller fall signals
    a change of this one. `weight` (0-1] and `trusted` come from `policy.credit.credit`: the speedup
    counts as `weight` of one sample (an outcome that weighs less than one takes no part in change
    detection), and beyond the `trusted` speedup (over the reference; None: all of it) at most
    START_SDS above the estimate (`start_ceiling`), for the score and its change detection alike."""
    if not counts_toward_score(verdict):
        return score
    clients = _client_stats(score)
    rates = _client_rates(score)
    run = score.run
    samples, successes = score.samples, score.successes
    cf, vf = score.compile_failures, score.verify_failures
    prior_weight = score.prior_weight
    if verdict.is_valid and speedup is not None and speedup > 0 and math.isfinite(speedup):
        lo, hi = band if band is not None else influence_band(score)
        x = credited_log_speedup(speedup, band=(lo, hi), trusted=trusted)
        w = min(1.0, max(1e-6, weight))
        own = clients.get(client, (0.0, 0.0, 0.0))
        if w >= 1.0:
            run = _run_after(score.run, client, detected_log_speedup(speedup, (lo, hi), trusted), lo, hi)
        if w >= 1.0 and run is not None and (abs(run.cusum) > CHANGE_THRESHOLD
                                             or (alarmed and run.cusum < -ALARMED_THRESHOLD)):
            # The truth has likely changed (a new compiler, a new driver): this client's older samples
            # give way to the run that showed it, so the estimate follows at once. No client can
            # discount another's samples, and a lone outlier stays bounded.
            if _prior_outdated(score, run):
                prior_weight = 0.0
            own, run = (float(run.n), run.mean, 0.0), None
        else:
            if own[0] + w > CLIENT_MAX_WEIGHT:  # make room by discounting this client's own past
                own = _scaled(own, max(0.0, CLIENT_MAX_WEIGHT - w) / own[0])
            own = _pool(own, (w, x, 0.0))
        clients[client] = own
        clients = _bounded(clients)
        samples += 1
        successes += speedup > 1.0
    elif verdict in COMPILE_FAILURES:
        cf += 1
    elif verdict in VERIFY_FAILURES:
        vf += 1
    # else a valid verdict without a speedup (no baseline timing): it compiled and verified
    rates = _attempted(rates, client, verdict not in COMPILE_FAILURES | VERIFY_FAILURES)
    return _with_clients(
        score,
        clients,
        {
            "samples": samples,
            "attempts": score.attempts + 1,
            "successes": successes,
            "compile_failures": cf,
            "verify_failures": vf,
            **_rates_update(rates),
            "run": run,
            "prior": False,
            "prior_weight": prior_weight,
            "updated_at": when or utcnow(),
        },
    )


def merge_scores(a: Score, b: Score) -> Score:
    """`a` with `b`'s measurements pooled in (per client, then bounded as every update is).

    Below the bounds this is exactly the statistics of the union of both sample sets. The prior
    stays `a`'s: a prior is a belief about the optimization, not evidence, so two copies of the same
    seed prior must not count twice. Identity fields are `a`'s.
    """
    clients = _client_stats(a)
    for name, stats in _client_stats(b).items():
        clients[name] = _pool(clients.get(name, (0.0, 0.0, 0.0)), stats)
    rates = _client_rates(a)
    for name, (ok, fail) in _client_rates(b).items():
        mine = rates.get(name, (0.0, 0.0))
        rates[name] = (mine[0] + ok, mine[1] + fail)
    return _with_clients(
        a,
        _bounded(clients),
        {
            "samples": a.samples + b.samples,
            "attempts": a.attempts + b.attempts,
            "successes": a.successes + b.successes,
            "compile_failures": a.compile_failures + b.compile_failures,
            "verify_failures": a.verify_failures + b.verify_failures,
            **_rates_update(_bounded_rates(rates)),
            "prior": a.prior and b.prior,
            "updated_at": max(a.updated_at, b.updated_at),
        },
    )


def subtract_scores(total: Score, part: Score) -> Score:
    """`total` without the measurements of `part` (the inverse of `merge_scores`).

    Used when merging KB files that share history: the outcomes both files hold are taken out of
    one side before pooling, so they are counted once. Exact while no bound was reached; counts are
    clamped at zero should `part` not actually be contained in `total`.
    """
    clients = _client_stats(total)
    for name, stats in _client_stats(part).items():
        if name in clients:
            clients[name] = _unpool(clients[name], stats)
    rates = _client_rates(total)
    for name, (ok, fail) in _client_rates(part).items():
        if name in rates:
            rates[name] = (max(0.0, rates[name][0] - ok), max(0.0, rates[name][1] - fail))
    attempts = max(0, total.attempts - part.attempts)
    return _with_clients(
        total,
        {n: s for n, s in clients.items() if s[0] > 0},
        {
            "samples": max(0, total.samples - part.samples),
            "attempts": attempts,
            "successes": max(0, total.successes - part.successes),
            "compile_failures": max(0, total.compile_failures - part.compile_failures),
            "verify_failures": max(0, total.verify_failures - part.verify_failures),
            **_rates_update({n: r for n, r in rates.items() if sum(r) > 0}),
            "prior": total.prior or attempts == 0,
        },
    )


def empty_like(score: Score) -> Score:
    """A Score with `score`'s identity and prior but no measurements."""
    return score.model_copy(
        update={
            "samples": 0, "mean_log_speedup": 0.0, "m2_log_speedup": 0.0, "attempts": 0, "successes": 0,
            "compile_failures": 0, "verify_failures": 0, "weight": 0.0, "ok_weight": 0.0, "fail_weight": 0.0,
            "clients": {}, "rates": {}, "run": None, "prior": True,
        }
    )


def posterior_mean_log_speedup(score: Score) -> float:
    """Measured mean shrunk toward the prior mean by the prior's weight (log space)."""
    return score.posterior_mean_log_speedup
