"""The regimes: each runs the rules side by side on one seed's world and returns its figures
(see `bench/learning_sim.py`)."""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kb_mcp.kb.models import Track, Verdict
from learnsim.rules import LegacyRule, Step, ToolRule, copy_kb, new_kb, seed_of
from learnsim.world import (
    ARCHES,
    MALLORY,
    NOISE_SD,
    Problem,
    World,
    drift,
    expected_gain,
    make_priors,
    make_world,
    sample_outcome,
    start_slowness,
)

# ---- regimes ----------------------------------------------------------------------------------------


def share(gains: Sequence[float], best: Sequence[float]) -> float:
    """Share of the oracle's gain earned over a window."""
    total = sum(best)
    return sum(gains) / total if total > 0 else float("nan")


def gap_closed(gains: Sequence[float], uniform: Sequence[float], best: Sequence[float]) -> float:
    """Share of the gap between uniform's gain and the oracle's closed over a window (uniform 0,
    oracle 1, whatever the options are worth)."""
    gap = sum(best) - sum(uniform)
    return (sum(gains) - sum(uniform)) / gap if gap > 0 else float("nan")


MEANS = "knows the means"
"""A rule no learner can beat on average: it knows every state's true means (not a problem's own
deviation from them) and always takes the best. What learning can reach in a world, however fast."""


def bandit_stream(world: World, seed: int, rules: dict[str, Any], rollouts: int, *, tag: str,
                  states: Sequence[str] | None = None, arches: Sequence[str] = ("hopper",),
                  drift_at: int | None = None, drift_kind: str = "lose-best", start: int = 0,
                  starts: str = "as eager") -> dict[str, Any]:
    """Single steps on fresh problems. Returns per-rollout gains per rule, and the oracle's,
    uniform's and MEANS's. `starts` (`world.START_SPEEDS`): how much slower than the reference each
    problem's first kernel is; the step optimizes that kernel, recorded against it as the parent
    (as eager: against the reference itself)."""
    rng = random.Random(f"stream-{seed}-{tag}")
    out: dict[str, list[Any]] = {name: [] for name in rules}
    out["oracle"], out["uniform"], out[MEANS], out["state"], out["arch"] = [], [], [], [], []
    drifted = False
    for t in range(start, start + rollouts):
        if drift_at is not None and t == drift_at and not drifted:
            drift(world, seed, drift_kind)
            drifted = True
        s = world.draw_state(rng, states)
        arch = rng.choice(list(arches))
        dev = Problem(random.Random(f"p-{seed}-{tag}-{t}")).dev(world, s)
        gains = {a: expected_gain(world, s, a, dev, arch) for a in world.options[s]}
        out["oracle"].append(max(gains.values()))
        out["uniform"].append(statistics.fmean(gains.values()))
        typical = dict.fromkeys(world.options[s], 0.0)  # a problem with no deviation of its own
        out[MEANS].append(gains[max(gains, key=lambda a: expected_gain(world, s, a, typical, arch))])
        out["state"].append(s)
        out["arch"].append(arch)
        slowness = start_slowness(starts, random.Random(f"start-{seed}-{tag}-{t}"))
        for name, rule in rules.items():
            step = Step(state=s, arch=arch, key=f"{seed}-{tag}-{name}-{t}", problem=f"p{tag}{t}")
            if isinstance(rule, LegacyRule):
                a = rule.choose_in(s, world.options[s], arch, random.Random(seed_of(step.key)))
                assert a is not None
                verdict, x = sample_outcome(world, s, a, dev, random.Random(f"o-{seed}-{tag}-{t}-{a}"), arch)
                rule.record(s, a, arch, verdict, x)
            else:
                if slowness > 1.0:
                    step = rule.first_kernel(step, slowness)
                a = rule.choose(step)
                assert a is not None, f"no suggestion in {s}"
                verdict, x = sample_outcome(world, s, a, dev, random.Random(f"o-{seed}-{tag}-{t}-{a}"), arch)
                rule.learn(step, a, verdict, x)
            out[name].append(gains[a])
    return out





def cumulative_to(target: float, gains: Sequence[float]) -> float:
    """Rollouts needed to accumulate `target` gain; beyond the stream, extrapolated at the rate of
    its last third (inf if that rate is not positive)."""
    total = 0.0
    for i, g in enumerate(gains, 1):
        total += g
        if total >= target:
            return float(i)
    rate = statistics.fmean(gains[-max(1, len(gains) // 3):]) if gains else 0.0
    return len(gains) + (target - total) / rate if rate > 0 else math.inf


def run_bandit(world: World, seed: int, folder: Path, rollouts: int, kinds: Sequence[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for kind in kinds:
        priors = make_priors(world, kind, seed)
        kb = new_kb(folder, f"bandit-{kind}", priors)
        new = ToolRule(kb)
        rules = {"old rule": LegacyRule(priors), "new rule": new}
        out = bandit_stream(world, seed, rules, rollouts, tag=f"b{kind}")
        row: dict[str, Any] = {}
        thirds = [(i * rollouts // 3, (i + 1) * rollouts // 3) for i in range(3)]
        for name in ("uniform", "old rule", "new rule", MEANS):
            row[name] = [share(out[name][lo:hi], out["oracle"][lo:hi]) for lo, hi in thirds]
        row["curve"] = {name: [share(out[name][i:i + 50], out["oracle"][i:i + 50]) for i in range(0, rollouts, 50)]
                        for name in ("uniform", "old rule", "new rule")}
        early = sum(out["oracle"][: rollouts // 3]) * 0.9
        # uniform's and the oracle's expected gains do not depend on the KB: extend the stream to find them
        extra = bandit_reference(world, seed, f"b{kind}", 5 * rollouts)
        row["to90"] = {
            "oracle": cumulative_to(early, extra["oracle"]),
            "uniform": cumulative_to(early, extra["uniform"]),
            "old rule": cumulative_to(early, out["old rule"]),
            "new rule": cumulative_to(early, out["new rule"]),
        }
        result[kind] = row
        if kind == "aligned":
            row["lean"] = new.lean(world.mu)
            result["_kb_aligned"] = str(kb)
            result["_legacy_aligned"] = rules["old rule"]
            result["_state_counts"] = _counts(out["state"])
    return result


def _counts(states: Sequence[str]) -> dict[str, int]:
    c: dict[str, int] = defaultdict(int)
    for s in states:
        c[s] += 1
    return dict(c)


def bandit_reference(world: World, seed: int, tag: str, rollouts: int) -> dict[str, list[float]]:
    """The oracle's and uniform's expected gains on the same stream (no KB involved)."""
    return bandit_stream(world, seed, {}, rollouts, tag=tag)


SUPPRESS_ALARM_RECORDS = 24
"""Surprising outcomes the attacker records across the track before suppressing (enough to raise it)."""


def run_suppress(world: World, seed: int, folder: Path, bandit: dict[str, Any], s: str) -> dict[str, Any]:
    """A client credits real, slow candidates (the state's worst effect, measured) to the best
    optimization of state `s`, to push it out of the first draws: its first-draw probability after
    n = 0, 1, 4 such records, on a quiet track and on one whose change alarm the same client raised
    first with SUPPRESS_ALARM_RECORDS slow outcomes credited to the best of the other states."""
    best = max(world.options[s], key=lambda a: world.mu[(s, a)])
    worst = min(world.mu[(s, a)] for a in world.options[s])
    out: dict[str, Any] = {}
    for case in ("quiet", "alarmed"):
        rule = ToolRule(copy_kb(Path(bandit["_kb_aligned"]), folder / f"suppress-{case}.json"), client=MALLORY)
        noise = random.Random(f"suppress-{seed}")
        if case == "alarmed":
            others = sorted(o for o in world.options if o != s)
            for i in range(SUPPRESS_ALARM_RECORDS):
                o = others[i % len(others)]
                top = max(world.options[o], key=lambda a: world.mu[(o, a)])
                x = min(world.mu[(o, a)] for a in world.options[o]) + noise.gauss(0, NOISE_SD)
                rule.learn(Step(state=o, arch="hopper", key=f"{seed}-alarm-{i}", problem=f"mallory-a{i}"), top,
                           Verdict.faster if x > 0 else Verdict.slower, x)
        with rule.ctx.store.read() as view:
            out[f"{case}_alarm_level"] = view.track_alarm(Track.fp32, "hopper")
        probs = []
        for n in range(5):
            if n:
                x = worst + noise.gauss(0, NOISE_SD)
                rule.learn(Step(state=s, arch="hopper", key=f"{seed}-suppress-{case}-{n}", problem=f"mallory-s{n}"),
                           best, Verdict.faster if x > 0 else Verdict.slower, x)
            if n in (0, 1, 4):
                probs.append(rule.first_draw(s, best, "hopper"))
        out[case] = probs
    return out


DRIFT_CURVE = ("uniform", "old rule", "new rule", "new rule, no change", MEANS)


def run_drift(world: World, seed: int, folder: Path, rollouts: int, kind: str = "lose-best") -> dict[str, Any]:
    """A stream whose truth changes half-way; per state, the level by problems since the change, on
    two scales: "share" (of the oracle's gain) and "gap" (of the gap between uniform and the oracle
    closed, `gap_closed`).

    Only the gap scale compares the level before a change with the level after it: the share's zero
    is "no gain", and a change that takes away each state's best optimization leaves options worth
    less next to the best, so even uniform, whose choices ignore the world, falls from 0.20 to 0.05
    of the oracle's gain. On the gap scale uniform is 0 and the oracle 1 in either world.

    Beside it, the control "new rule, no change": the same rule on the same stream in a world where
    the changed truth held from the first rollout (its priors aligned with it). Its level over the
    same problems is the level the rule reaches in the changed world, had nothing changed (a world
    whose best is nearer the rest is also harder to learn, which no rule can undo). And MEANS, which
    knows the state's true means from the moment they change: what any rule could reach there."""
    priors = make_priors(world, "aligned", seed)
    rules = {"old rule": LegacyRule(priors), "new rule": ToolRule(new_kb(folder, f"drift-{kind}", priors))}
    at = rollouts // 2
    out = bandit_stream(world, seed, rules, rollouts, tag="drift", drift_at=at, drift_kind=kind)
    changed = make_world(seed)
    drift(changed, seed, kind)
    control = ToolRule(new_kb(folder, f"drift-{kind}-control", make_priors(changed, "aligned", seed)))
    unchanged = bandit_stream(changed, seed, {"new rule": control}, rollouts, tag="drift")
    out["new rule, no change"] = unchanged["new rule"]
    oracle = dict.fromkeys(DRIFT_CURVE, out["oracle"]) | {"new rule, no change": unchanged["oracle"]}
    uniform = dict.fromkeys(DRIFT_CURVE, out["uniform"]) | {"new rule, no change": unchanged["uniform"]}
    curves: dict[str, dict[int, list[tuple[float, float, float]]]] = {name: defaultdict(list) for name in DRIFT_CURVE}
    by_state: dict[str, list[int]] = defaultdict(list)
    for t, s in enumerate(out["state"]):
        by_state[s].append(t)
    for ts in by_state.values():
        pre = [t for t in ts if t < at]
        post = [t for t in ts if t >= at]
        if len(pre) < 10 or len(post) < 20:
            continue
        visits = [(-k, t) for k, t in list(enumerate(reversed(pre), 1))[:10]] + list(enumerate(post[:30], 1))
        for k, t in visits:
            for name in curves:
                curves[name][k].append((out[name][t], uniform[name][t], oracle[name][t]))
    return {
        "share": {name: {k: share([g for g, _, _ in v], [b for _, _, b in v]) for k, v in c.items()}
                  for name, c in curves.items()},
        "gap": {name: {k: gap_closed(*zip(*v)) for k, v in c.items()} for name, c in curves.items()},
    }


def run_multistep(world: World, seed: int, folder: Path, problems: int, horizon: int) -> dict[str, Any]:
    """Trajectories: each problem starts at the reference and takes `horizon` steps; an improvement
    is kept (and the kernel moves to a new state), anything else is dropped."""
    priors = make_priors(world, "aligned", seed)
    rules: dict[str, Any] = {
        "old rule": LegacyRule(priors),
        "new rule": ToolRule(new_kb(folder, "multi-new", priors)),
        "new rule, no lineage": ToolRule(new_kb(folder, "multi-nolineage", priors), lineage=False),
        "new rule, no phase ordering": ToolRule(new_kb(folder, "multi-nophase", priors), phase_ordering=False),
        "uniform": None,
        "oracle": None,
    }
    finals: dict[str, list[float]] = defaultdict(list)
    to90: dict[str, list[float]] = defaultdict(list)
    reapplied: dict[str, int] = defaultdict(int)
    steps_taken: dict[str, int] = defaultdict(int)
    for p in range(problems):
        start = world.draw_state(random.Random(f"ms-{seed}-{p}"))
        for name, rule in rules.items():
            problem = Problem(random.Random(f"msp-{seed}-{p}"))
            lineage: frozenset[str] = frozenset()
            tried: frozenset[str] = frozenset()
            s, kernel_ms, parent = start, 1.0, None
            trail = [0.0]
            for i in range(horizon):
                dev = problem.dev(world, s)
                step = Step(state=s, arch="hopper", key=f"{seed}-ms-{name}-{p}-{i}", problem=f"msp{p}",
                            parent=parent, parent_ms=kernel_ms, tried=tried)
                options = [a for a in world.options[s] if a not in tried]
                if rule is None and name == "uniform":
                    a = random.Random(seed_of(step.key)).choice(options) if options else None
                elif rule is None:
                    gain = {o: expected_gain(world, s, o, dev, lineage=lineage) for o in options}
                    a = max(options, key=gain.__getitem__) if options else None
                elif isinstance(rule, LegacyRule):
                    a = rule.choose_in(s, options, "hopper", random.Random(seed_of(step.key)))
                else:
                    a = rule.choose(step)
                if a is None:
                    trail.append(trail[-1])
                    continue
                steps_taken[name] += 1
                reapplied[name] += a in lineage
                noise = random.Random(f"mso-{seed}-{p}-{i}-{a}-{sorted(lineage)}")
                verdict, x = sample_outcome(world, s, a, dev, noise, lineage=lineage)
                accepted = x is not None and x > 0
                nxt = world.move(s, a, random.Random(f"msm-{seed}-{p}-{i}-{a}")) if accepted else None
                if isinstance(rule, LegacyRule):
                    rule.record(s, a, "hopper", verdict, x)
                    cid = None
                elif isinstance(rule, ToolRule):
                    cid = rule.learn(step, a, verdict, x, next_state=nxt)
                else:
                    cid = None
                tried = tried | {a}
                if accepted:
                    assert x is not None and nxt is not None
                    kernel_ms *= math.exp(-x)
                    lineage = lineage | {a}
                    parent, s, tried = cid, nxt, frozenset()
                trail.append(-math.log(kernel_ms))
            final = trail[-1]
            if p >= problems // 2:
                finals[name].append(final)
                to90[name].append(next(i for i, v in enumerate(trail) if v >= 0.9 * final) if final > 0 else 0)
    return {
        "final": {k: statistics.fmean(v) for k, v in finals.items()},
        "to90": {k: statistics.fmean(v) for k, v in to90.items()},
        "reapplied": {k: reapplied[k] / max(1, steps_taken[k]) for k in rules},
    }


def run_transfer(world: World, seed: int, folder: Path, train: int, test: int) -> dict[str, Any]:
    """Trained on problem set A, tested on a disjoint set B: with states shared, and with disjoint states."""
    priors = make_priors(world, "uninformative", seed)
    order = world.states[:]
    random.Random(f"split-{seed}").shuffle(order)
    half_a, half_b = order[::2], order[1::2]
    out: dict[str, Any] = {}
    for mode, (sa, sb) in {"shared states": (None, None), "disjoint states": (half_a, half_b)}.items():
        kb_trained = new_kb(folder, f"transfer-{mode[:4]}", priors)
        trained = ToolRule(kb_trained)
        legacy = LegacyRule(priors)
        bandit_stream(world, seed, {"new rule": trained, "old rule": legacy}, train, tag=f"tA{mode[:4]}", states=sa)
        fresh = ToolRule(new_kb(folder, f"transfer-fresh-{mode[:4]}", priors))
        legacy_fresh = LegacyRule(priors)
        tested = {"new rule": trained, "new fresh": fresh, "old rule": legacy, "old fresh": legacy_fresh}
        res = bandit_stream(world, seed, tested, test, tag=f"tB{mode[:4]}", states=sb, start=10_000)
        out[mode] = {
            "new rule": share(res["new rule"], res["oracle"]) - share(res["new fresh"], res["oracle"]),
            "old rule": share(res["old rule"], res["oracle"]) - share(res["old fresh"], res["oracle"]),
        }
    return out


def run_arch(world: World, seed: int, folder: Path, rollouts: int) -> dict[str, Any]:
    """Two GPU families with correlated truths: per-arch scores with the pooled fallback."""
    priors = make_priors(world, "uninformative", seed)
    rules = {
        "old rule": LegacyRule(priors),
        "new rule": ToolRule(new_kb(folder, "arch", priors)),
        "new rule, pooled only": ToolRule(new_kb(folder, "arch-pooled", priors), arch_aware=False),
    }
    out = bandit_stream(world, seed, rules, rollouts, tag="arch", arches=("hopper", "ampere"))
    res: dict[str, Any] = {}
    lo = rollouts * 2 // 3
    for family in ARCHES:
        idx = [t for t in range(lo, rollouts) if out["arch"][t] == family]
        res[family] = {name: share([out[name][t] for t in idx], [out["oracle"][t] for t in idx])
                       for name in ("uniform", *rules)}
    return res


def quick_comparison(seed: int, rollouts: int, n_states: int, folder: Path) -> dict[str, float]:
    """Share of the oracle's gain over the last half of a short aligned-prior stream restricted to the
    `n_states` most visited states, old rule and new rule on the same world and the same stream
    (the CPU test's check that the shipped rule beats the old one)."""
    world = make_world(seed)
    states = sorted(world.states, key=lambda s: -world.weights[world.states.index(s)])[:n_states]
    priors = make_priors(world, "aligned", seed)
    rules = {"old rule": LegacyRule(priors), "new rule": ToolRule(new_kb(folder, f"quick-{seed}", priors))}
    out = bandit_stream(world, seed, rules, rollouts, tag="quick", states=states)
    half = rollouts // 2
    return {name: share(out[name][half:], out["oracle"][half:]) for name in (*rules, "uniform")}
