"""Does the KB make agents choose better? A simulated world, the real tools, four rules side by side.

    python bench/learning_sim.py                      # 20 seeds, every regime, plots in out/learning_sim/
    python bench/learning_sim.py --seeds 4 --quick    # a few minutes: fewer rollouts, fewer regimes
    python bench/learning_sim.py --regimes bandit poison --seeds 20 --jobs 2

No GPU: the world is hidden, the measurements are simulated, and everything else is real. The new
rule is our shipped policy: every choice is `tools.suggest_optimizations.run` on a real KB file
(seeded from the shipped seed KB), taking the first suggestion with the tool's defaults; every
outcome is a `CandidateRecord` stored as `compile_and_verify` would store it, credited through
`tools.record_outcome.run`. The old rule is the policy kb-mcp shipped before (softmax over a
utility at temperature 0.3, every sample kept at full weight, credit against any parent the
caller names, lineage-blind exclusions), replayed in memory with its exact arithmetic. Uniform
picks at random; the oracle knows every true effect, including the problem's own.

The world (one per seed), over the seed KB's 23 states and their applicable optimizations:

* each (state, optimization) has a hidden true mean log-speedup, heavy-tailed (a Student t with
  3 degrees of freedom: most optimizations do little, a few do a lot, some harm), and a chance of
  failing to compile or verify (mean 25 %);
* each problem deviates from its state's means (sd PROBLEM_SD); each measurement is noisy (sd NOISE_SD);
* states are visited with Zipf-like frequencies; applying an optimization moves the kernel to
  another state with a hidden per-(state, optimization) distribution (multi-step regime);
* the KB's priors are set aligned with the truth, uninformative (all neutral) or misleading (the
  truth's ranking reversed) before the first rollout.

Regimes: `bandit` (single steps on fresh problems, 900 rollouts, three prior kinds), `multistep`
(trajectories of several steps per problem, lineage and phase ordering matter), `transfer` (a KB
trained on one problem set, tested on another), `arch` (two GPU families with correlated truths),
`drift` (the truth changes mid-stream), `poison` (a client crediting a harmful optimization against
a deliberately 100x slow parent). Every figure is a mean over seeds with a 95 % t-interval.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kb_mcp.kb.models import ALL_ARCH, CandidateRecord, Score, Verdict
from kb_mcp.kb.seed import seed_scores, seed_states
from kb_mcp.kb.store import KBStore
from kb_mcp.policy import phase
from kb_mcp.policy.select import CalibrationSums, first_draw_probabilities
from kb_mcp.tools import record_outcome, suggest_optimizations
from kb_mcp.tools.context import ToolContext

PROBLEM_SD = 0.1  # a problem's own deviation from its state's true mean (log units)
NOISE_SD = 0.25  # measurement noise of one outcome (log units)
EFFECT_SCALE = 0.2  # scale of the Student-t(3) true means
EFFECT_SHIFT = 0.12  # true means are centred above zero: most listed optimizations help a bit
MAX_EFFECT = 1.8  # true means are clipped to +-this (x6)
REAPPLY_MEAN = -0.03  # re-applying what the kernel already has: nothing to gain, a little to lose
ARCHES = {"hopper": ("sm_90", "NVIDIA H100"), "ampere": ("sm_80", "NVIDIA A100")}
ARCH_CORRELATION = 0.5  # between the two families' true means (cross-arch regime)
HONEST = "agent"
MALLORY = "mallory"
RULES = ("uniform", "old rule", "new rule", "oracle")


# ---- the world -------------------------------------------------------------------------------------


@dataclass
class World:
    """The hidden truth of one seed."""

    states: list[str]
    weights: list[float]
    options: dict[str, list[str]]
    mu: dict[tuple[str, str], float]
    fail: dict[tuple[str, str], float]
    mu_alt: dict[tuple[str, str], float]  # the other arch family's true means
    moves: dict[tuple[str, str], list[tuple[str, float]]]
    seed_priors: dict[tuple[str, str], float]

    def draw_state(self, rng: random.Random, among: Sequence[str] | None = None) -> str:
        if among is None:
            return rng.choices(self.states, self.weights)[0]
        ws = [self.weights[self.states.index(s)] for s in among]
        return rng.choices(list(among), ws)[0]

    def truth(self, arch: str) -> dict[tuple[str, str], float]:
        return self.mu if arch == "hopper" else self.mu_alt

    def move(self, s: str, a: str, rng: random.Random) -> str:
        nexts, probs = zip(*self.moves[(s, a)])
        return rng.choices(nexts, probs)[0]


def _student_t3(rng: random.Random) -> float:
    return rng.gauss(0, 1) / math.sqrt(rng.gammavariate(1.5, 2.0) / 3.0)


def make_world(seed: int) -> World:
    """A hidden truth over the seed KB's states and applicable optimizations."""
    rng = random.Random(f"world-{seed}")
    states = [s.id for s in seed_states()]
    options: dict[str, list[str]] = defaultdict(list)
    seed_priors = {}
    for sc in seed_scores():
        options[sc.state_id].append(sc.optimization_id)
        seed_priors[(sc.state_id, sc.optimization_id)] = sc.prior_mean_log_speedup
    order = states[:]
    rng.shuffle(order)
    weights = [1.0 / (order.index(s) + 1) ** 0.8 for s in states]
    mu, fail, mu_alt, moves = {}, {}, {}, {}
    for s in states:
        options[s].sort()
        for a in options[s]:
            m = max(-MAX_EFFECT, min(MAX_EFFECT, EFFECT_SHIFT + EFFECT_SCALE * _student_t3(rng)))
            mu[(s, a)] = m
            fail[(s, a)] = rng.betavariate(2.5, 7.5)
            alt = EFFECT_SHIFT + EFFECT_SCALE * _student_t3(rng)
            mu_alt[(s, a)] = max(-MAX_EFFECT, min(MAX_EFFECT, ARCH_CORRELATION * m + math.sqrt(1 - ARCH_CORRELATION**2) * alt))
            others = [x for x in states if x != s]
            targets = rng.sample(others, 2)
            stay = rng.uniform(0.2, 0.7)
            split = rng.random()
            moves[(s, a)] = [(s, stay), (targets[0], (1 - stay) * split), (targets[1], (1 - stay) * (1 - split))]
    return World(states, weights, dict(options), mu, fail, mu_alt, moves, seed_priors)


def make_priors(world: World, kind: str, seed: int) -> dict[tuple[str, str], float]:
    """Prior mean log-speedups: 'seed' (the shipped ones), 'aligned', 'uninformative' or 'misleading'."""
    rng = random.Random(f"priors-{seed}-{kind}")
    if kind == "seed":
        return dict(world.seed_priors)
    out = {}
    for s, opts in world.options.items():
        centre = statistics.fmean(world.mu[(s, a)] for a in opts)
        for a in opts:
            dev = world.mu[(s, a)] - centre
            if kind == "aligned":
                out[(s, a)] = centre + 0.7 * dev + rng.gauss(0, 0.1)
            elif kind == "misleading":
                out[(s, a)] = centre - 0.7 * dev + rng.gauss(0, 0.1)
            else:
                out[(s, a)] = 0.0
    return out


@dataclass
class Problem:
    """One problem: its own deviations from the state means, drawn as states are visited."""

    rng: random.Random
    devs: dict[str, dict[str, float]] = field(default_factory=dict)

    def dev(self, world: World, s: str) -> dict[str, float]:
        if s not in self.devs:
            self.devs[s] = {a: self.rng.gauss(0, PROBLEM_SD) for a in world.options[s]}
        return self.devs[s]


def expected_gain(world: World, s: str, a: str, dev: dict[str, float], arch: str = "hopper", lineage: frozenset[str] = frozenset()) -> float:
    """What trying `a` is worth on this problem, in expectation: failures gain nothing."""
    mean = REAPPLY_MEAN if a in lineage else world.truth(arch)[(s, a)] + dev[a]
    return (1.0 - world.fail[(s, a)]) * mean


def sample_outcome(world: World, s: str, a: str, dev: dict[str, float], rng: random.Random, arch: str = "hopper",
                   lineage: frozenset[str] = frozenset()) -> tuple[Verdict, float | None]:
    """The measured result of one attempt: a failure verdict, or a timed one with its log-speedup."""
    if rng.random() < world.fail[(s, a)]:
        return (Verdict.compile_error if rng.random() < 0.5 else Verdict.incorrect), None
    mean = REAPPLY_MEAN if a in lineage else world.truth(arch)[(s, a)] + dev[a]
    x = rng.gauss(mean, NOISE_SD)
    return (Verdict.faster if x > 0 else Verdict.slower), x


# ---- the rules -------------------------------------------------------------------------------------


@dataclass
class Step:
    """One choice to make: where the kernel is and what it already holds."""

    state: str
    arch: str
    key: str  # unique per rollout (seeds draws and names candidates)
    problem: str
    parent: str | None = None  # candidate id of the current kernel (None: the reference)
    parent_ms: float = 1.0
    tried: frozenset[str] = frozenset()  # tried on this kernel already (the campaign's old exclude list)


class ToolRule:
    """The shipped policy: suggest_optimizations and record_outcome on a real KB file."""

    name = "new rule"

    def __init__(self, kb: Path, client: str = HONEST, *, lineage: bool = True, arch_aware: bool = True,
                 phase_ordering: bool = True) -> None:
        self.ctx = ToolContext(kb, client_name=client, standby_profiler=False)
        self.lineage = lineage
        self.arch_aware = arch_aware
        self.phase_ordering = phase_ordering

    def choose(self, step: Step) -> str | None:
        req = suggest_optimizations.Request(
            state_id=step.state, arch=ARCHES[step.arch][0] if self.arch_aware else None,
            candidate_id=step.parent if self.lineage else None, exclude=sorted(step.tried), seed=_seed_of(step.key),
        )
        saved = phase.LOOKAHEAD
        if not self.phase_ordering:  # an ablation: the same tool, blind to where optimizations led
            phase.LOOKAHEAD = 0.0
        try:
            res = suggest_optimizations.run(self.ctx, req)
        finally:
            phase.LOOKAHEAD = saved
        return res.suggestions[0].id if res.suggestions else None

    def learn(self, step: Step, a: str, verdict: Verdict, x: float | None, *, next_state: str | None = None,
              client_parent: str | None = None, parent_ms: float | None = None) -> str:
        cid = f"c_{step.key}"
        arch, device = ARCHES[step.arch]
        time_ms = (parent_ms or step.parent_ms) * math.exp(-x) if x is not None else None
        with self.ctx.store.transaction() as tx:
            tx.put_candidate(CandidateRecord(
                candidate_id=cid, problem=step.problem, problem_hash=step.problem, verdict=verdict, arch=arch,
                device=device, time_ms=time_ms, eager_ms=1.0,
            ))
        record_outcome.run(self.ctx, record_outcome.Request(
            state_id=step.state, optimization_id=a, candidate_id=cid,
            parent_candidate_id=client_parent if client_parent is not None else step.parent, next_state_id=next_state,
        ))
        return cid

    def first_draw(self, state: str, opt: str, arch: str = "hopper") -> float:
        """Chance `opt` is the first suggestion in `state` (the policy's own estimate over 4000 draws)."""
        with self.ctx.store.read() as view:
            pool = view.candidates(state, arch)
            base = CalibrationSums(*view.calibration_sums())
        ids = [s.optimization_id for s in pool]
        probs = first_draw_probabilities(pool, draws=4000, seed=1, base=base)
        return probs[ids.index(opt)] if opt in ids else 0.0


class LegacyRule:
    """The policy kb-mcp shipped before, with its exact arithmetic, on in-memory scores.

    Selection: softmax of u / 0.3 (Gumbel top-k), u = p_ok * posterior mean - (1 - p_ok) * log 1.05,
    +log 1.1 for the untried. Update: Welford, every sample at full weight, log-speedup clipped to
    +-log 8, credit against any verified parent the caller names. Per-arch score where measured,
    else the pooled one. The campaign excluded only what was tried on the current kernel.
    """

    name = "old rule"
    T = 0.3

    def __init__(self, priors: dict[tuple[str, str], float]) -> None:
        self.priors = priors
        self.stats: dict[tuple[str, str, str], list[float]] = {}  # (state, opt, arch) -> [n, mean, m2, attempts, fails]

    def _score(self, s: str, a: str, arch: str) -> list[float]:
        row = self.stats.get((s, a, arch))
        if row is not None:
            return row
        if arch != ALL_ARCH and (s, a, ALL_ARCH) in self.stats:
            return self.stats[(s, a, ALL_ARCH)]
        return [0, 0.0, 0.0, 0, 0]

    def utility(self, s: str, a: str, arch: str) -> float:
        n, mean, _, attempts, fails = self._score(s, a, arch)
        m0, w0 = self.priors.get((s, a), 0.0), 1.0
        post = (n * mean + m0 * w0) / (n + w0)
        p_ok = (n + w0) / (n + fails + w0)
        u = p_ok * post - (1 - p_ok) * math.log(1.05)
        return u + (math.log(1.10) if attempts == 0 else 0.0)

    def probabilities(self, s: str, options: Sequence[str], arch: str) -> list[float]:
        us = [self.utility(s, a, arch) / self.T for a in options]
        top = max(us)
        ws = [math.exp(u - top) for u in us]
        return [w / sum(ws) for w in ws]

    def choose_in(self, s: str, options: Sequence[str], arch: str, rng: random.Random) -> str | None:
        if not options:
            return None
        keyed = []
        for a in options:
            u = rng.random() or 5e-324
            keyed.append((self.utility(s, a, arch) / self.T - math.log(-math.log(u)), a))
        return max(keyed)[1]

    def record(self, s: str, a: str, arch: str, verdict: Verdict, log_speedup: float | None) -> None:
        for key in {(s, a, arch), (s, a, ALL_ARCH)}:
            row = self.stats.setdefault(key, [0, 0.0, 0.0, 0, 0])
            row[3] += 1
            if log_speedup is not None:
                x = max(-math.log(8), min(math.log(8), log_speedup))
                row[0] += 1
                delta = x - row[1]
                row[1] += delta / row[0]
                row[2] += delta * (x - row[1])
            elif not verdict.is_valid:
                row[4] += 1


def _seed_of(key: str) -> int:
    return int.from_bytes(key.encode()[-8:].rjust(8, b"\0"), "big") % (2**31)


def new_kb(folder: Path, name: str, priors: dict[tuple[str, str], float]) -> Path:
    """A KB file seeded as kb-mcp seeds one, with the regime's prior means written over the seed's."""
    path = folder / f"{name}.json"
    store = KBStore.open(path)
    with store.transaction() as tx:
        for (s, a), m in priors.items():
            score = tx.get_score(s, a, ALL_ARCH) or Score(state_id=s, optimization_id=a)
            tx.put_score(score.model_copy(update={"prior_mean_log_speedup": m}))
    return path


def copy_kb(src: Path, dest: Path) -> Path:
    for suffix in ("", ".journal"):
        if Path(str(src) + suffix).exists():
            shutil.copyfile(str(src) + suffix, str(dest) + suffix)
    return dest


# ---- regimes ----------------------------------------------------------------------------------------


def share(gains: Sequence[float], best: Sequence[float]) -> float:
    """Share of the oracle's gain earned over a window."""
    total = sum(best)
    return sum(gains) / total if total > 0 else float("nan")


def bandit_stream(world: World, seed: int, rules: dict[str, Any], rollouts: int, *, tag: str,
                  states: Sequence[str] | None = None, arches: Sequence[str] = ("hopper",),
                  drift_at: int | None = None, drift_kind: str = "lose-best", start: int = 0) -> dict[str, Any]:
    """Single steps on fresh problems. Returns per-rollout gains per rule, and the oracle's and uniform's."""
    rng = random.Random(f"stream-{seed}-{tag}")
    out: dict[str, list[float]] = {name: [] for name in rules}
    out["oracle"], out["uniform"], out["state"], out["arch"] = [], [], [], []
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
        out["state"].append(s)
        out["arch"].append(arch)
        for name, rule in rules.items():
            step = Step(state=s, arch=arch, key=f"{seed}-{tag}-{name}-{t}", problem=f"p{tag}{t}")
            if isinstance(rule, LegacyRule):
                a = rule.choose_in(s, world.options[s], arch, random.Random(_seed_of(step.key)))
                assert a is not None
                verdict, x = sample_outcome(world, s, a, dev, random.Random(f"o-{seed}-{tag}-{t}-{a}"), arch)
                rule.record(s, a, arch, verdict, x)
            else:
                a = rule.choose(step)
                assert a is not None, f"no suggestion in {s}"
                verdict, x = sample_outcome(world, s, a, dev, random.Random(f"o-{seed}-{tag}-{t}-{a}"), arch)
                rule.learn(step, a, verdict, x)
            out[name].append(gains[a])
    return out


DRIFT_SHIFT_SD = 0.0  # every other true effect moves by this much when the truth changes


def drift(world: World, seed: int, kind: str = "lose-best") -> None:
    """The truth changes. `lose-best`: each state's best optimization stops paying (its true effect
    drops to the state's worst) and every other effect moves by N(0, DRIFT_SHIFT_SD); `shuffle`: each
    state's true effects are dealt out again among its optimizations (nothing learnt stays true)."""
    rng = random.Random(f"drift-{seed}-{kind}")
    for s, opts in world.options.items():
        values = [world.mu[(s, a)] for a in opts]
        if kind == "shuffle":
            rng.shuffle(values)
        else:
            best = max(range(len(opts)), key=lambda i: (1 - world.fail[(s, opts[i])]) * values[i])
            worst = min(values)
            values = [worst if i == best else v + rng.gauss(0, DRIFT_SHIFT_SD) for i, v in enumerate(values)]
        for a, v in zip(opts, values):
            world.mu[(s, a)] = v


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
        rules = {"old rule": LegacyRule(priors), "new rule": ToolRule(kb)}
        out = bandit_stream(world, seed, rules, rollouts, tag=f"b{kind}")
        row: dict[str, Any] = {}
        thirds = [(i * rollouts // 3, (i + 1) * rollouts // 3) for i in range(3)]
        for name in ("uniform", "old rule", "new rule"):
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


def run_poison(world: World, seed: int, folder: Path, bandit: dict[str, Any]) -> dict[str, Any]:
    """A client credits the worst optimization of the most visited state against a 100x slow parent."""
    counts = bandit["_state_counts"]
    s = max(counts, key=lambda k: (counts[k], k))
    h = min(world.options[s], key=lambda a: world.mu[(s, a)])
    legacy: LegacyRule = bandit["_legacy_aligned"]
    kb = copy_kb(Path(bandit["_kb_aligned"]), folder / "poison.json")
    new = ToolRule(kb, client=MALLORY)
    out: dict[str, list[float]] = {"old rule": [], "new rule": []}
    noise = random.Random(f"poison-{seed}")
    for n in range(5):
        if n:
            x = world.mu[(s, h)] + noise.gauss(0, NOISE_SD)  # the harmful change, really applied and timed
            step = Step(state=s, arch="hopper", key=f"{seed}-poison-{n}", problem=f"mallory{n}")
            parent = f"c_{seed}-poison-parent-{n}"
            with new.ctx.store.transaction() as tx:  # a verified but deliberately slow parent
                tx.put_candidate(CandidateRecord(candidate_id=parent, problem=step.problem, problem_hash=step.problem,
                                                 verdict=Verdict.slower, arch="sm_90", device=ARCHES["hopper"][1],
                                                 time_ms=100.0, eager_ms=1.0))
            new.learn(step, h, Verdict.faster if x > 0 else Verdict.slower, x, client_parent=parent, parent_ms=1.0)
            legacy.record(s, h, "hopper", Verdict.faster, math.log(100.0) + x)
        if n in (0, 1, 4):
            options = world.options[s]
            out["old rule"].append(legacy.probabilities(s, options, "hopper")[options.index(h)])
            out["new rule"].append(new.first_draw(s, h, "hopper"))
    return {"state": s, "harmful": h, "true_mu": world.mu[(s, h)], **out}


def run_drift(world: World, seed: int, folder: Path, rollouts: int, kind: str = "lose-best") -> dict[str, Any]:
    """A stream whose truth changes half-way; per state, the share by problems since the change."""
    priors = make_priors(world, "aligned", seed)
    kb = new_kb(folder, f"drift-{kind}", priors)
    rules = {"old rule": LegacyRule(priors), "new rule": ToolRule(kb)}
    at = rollouts // 2
    out = bandit_stream(world, seed, rules, rollouts, tag="drift", drift_at=at, drift_kind=kind)
    curves: dict[str, dict[int, list[float]]] = {name: defaultdict(list) for name in ("uniform", "old rule", "new rule")}
    by_state: dict[str, list[int]] = defaultdict(list)
    for t, s in enumerate(out["state"]):
        by_state[s].append(t)
    for s, ts in by_state.items():
        pre = [t for t in ts if t < at]
        post = [t for t in ts if t >= at]
        if len(pre) < 10 or len(post) < 20:
            continue
        for k, t in list(enumerate(reversed(pre), 1))[:10]:
            for name in curves:
                curves[name][-k].append((out[name][t], out["oracle"][t]))
        for k, t in enumerate(post[:30], 1):
            for name in curves:
                curves[name][k].append((out[name][t], out["oracle"][t]))
    return {name: {k: share([g for g, _ in v], [b for _, b in v]) for k, v in c.items()} for name, c in curves.items()}


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
            s, kernel_ms, parent, lineage, tried = start, 1.0, None, frozenset(), frozenset()
            trail = [0.0]
            for i in range(horizon):
                dev = problem.dev(world, s)
                step = Step(state=s, arch="hopper", key=f"{seed}-ms-{name}-{p}-{i}", problem=f"msp{p}",
                            parent=parent, parent_ms=kernel_ms, tried=tried)
                options = [a for a in world.options[s] if a not in tried]
                if rule is None and name == "uniform":
                    a = random.Random(_seed_of(step.key)).choice(options) if options else None
                elif rule is None:
                    a = max(options, key=lambda o: expected_gain(world, s, o, dev, lineage=lineage)) if options else None
                elif isinstance(rule, LegacyRule):
                    a = rule.choose_in(s, options, "hopper", random.Random(_seed_of(step.key)))
                else:
                    a = rule.choose(step)
                if a is None:
                    trail.append(trail[-1])
                    continue
                steps_taken[name] += 1
                reapplied[name] += a in lineage
                verdict, x = sample_outcome(world, s, a, dev, random.Random(f"mso-{seed}-{p}-{i}-{a}-{sorted(lineage)}"),
                                            lineage=lineage)
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
        res = bandit_stream(world, seed, {"new rule": trained, "new fresh": fresh, "old rule": legacy, "old fresh": legacy_fresh},
                            test, tag=f"tB{mode[:4]}", states=sb, start=10_000)
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


# ---- one seed, all regimes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    rollouts: int = 900
    kinds: tuple[str, ...] = ("aligned", "uninformative", "misleading")
    regimes: tuple[str, ...] = ("bandit", "poison", "drift", "multistep", "transfer", "arch")
    drift_rollouts: int = 1200
    problems: int = 120
    horizon: int = 6
    train: int = 300
    test: int = 100
    tmp: str | None = None


def run_seed(args: tuple[int, Config]) -> dict[str, Any]:
    """Every regime for one seed (each in its own fresh world and KB files)."""
    seed, cfg = args
    started = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix=f"learning-sim-{seed}-", dir=cfg.tmp))
    try:
        out: dict[str, Any] = {"seed": seed}
        if "bandit" in cfg.regimes or "poison" in cfg.regimes:
            kinds = cfg.kinds if "bandit" in cfg.regimes else ("aligned",)
            bandit = run_bandit(make_world(seed), seed, base, cfg.rollouts, kinds)
            out["bandit"] = {k: v for k, v in bandit.items() if not k.startswith("_")}
            if "poison" in cfg.regimes:
                out["poison"] = run_poison(make_world(seed), seed, base, bandit)
        if "drift" in cfg.regimes:
            out["drift"] = run_drift(make_world(seed), seed, base, cfg.drift_rollouts)
            out["drift_shuffle"] = run_drift(make_world(seed), seed, base, cfg.drift_rollouts, "shuffle")
        if "multistep" in cfg.regimes:
            out["multistep"] = run_multistep(make_world(seed), seed, base, cfg.problems, cfg.horizon)
        if "transfer" in cfg.regimes:
            out["transfer"] = run_transfer(make_world(seed), seed, base, cfg.train, cfg.test)
        if "arch" in cfg.regimes:
            out["arch"] = run_arch(make_world(seed), seed, base, cfg.rollouts)
        out["wall_s"] = time.monotonic() - started
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---- statistics and the report ------------------------------------------------------------------------

_T975 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 24: 2.064, 29: 2.045, 39: 2.023, 59: 2.001}


def interval(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95 % t-interval) over seeds; infinities and NaNs left out."""
    vs = [v for v in values if math.isfinite(v)]
    if not vs:
        return math.nan, math.nan
    if len(vs) == 1:
        return vs[0], math.nan
    df = len(vs) - 1
    t = _T975.get(df) or _T975[max(k for k in _T975 if k <= df)]
    return statistics.fmean(vs), t * statistics.stdev(vs) / math.sqrt(len(vs))


def fmt(values: Sequence[float], digits: int = 2) -> str:
    m, h = interval(values)
    if math.isnan(m):
        return "-"
    return f"{m:.{digits}f} ± {h:.{digits}f}" if math.isfinite(h) else f"{m:.{digits}f}"


def report(results: list[dict[str, Any]], cfg: Config, out_dir: Path, wall: float) -> str:
    """The printed tables (also written to out_dir/summary.txt) and the plots."""
    lines = [f"learning_sim: {len(results)} seeds, mean ± 95 % interval over seeds; wall {wall:.0f} s", ""]
    if any("bandit" in r for r in results):
        lines.append(f"Bandit stream (single steps on fresh problems, {cfg.rollouts} rollouts): share of the oracle's per-step gain")
        lines.append(f"{'priors':<14}{'rule':<10}{'rollouts 1-300':>18}{'301-600':>18}{'601-900':>18}{'to 90% early':>16}")
        for kind in cfg.kinds:
            rows = [r["bandit"][kind] for r in results if kind in r.get("bandit", {})]
            if not rows:
                continue
            for name in ("uniform", "old rule", "new rule"):
                cells = [fmt([row[name][i] for row in rows]) for i in range(3)]
                lines.append(f"{kind:<14}{name:<10}{cells[0]:>18}{cells[1]:>18}{cells[2]:>18}"
                             f"{fmt([row['to90'][name] for row in rows], 0):>16}")
            lines.append(f"{kind:<14}{'oracle':<10}{'1':>18}{'1':>18}{'1':>18}{fmt([row['to90']['oracle'] for row in rows], 0):>16}")
            gap = [(row["to90"]["uniform"] - row["to90"][n]) / (row["to90"]["uniform"] - row["to90"]["oracle"])
                   for row in rows for n in ("new rule",)]
            gap_old = [(row["to90"]["uniform"] - row["to90"]["old rule"]) / (row["to90"]["uniform"] - row["to90"]["oracle"])
                       for row in rows]
            lines.append(f"{'':<14}gap closed (uniform -> oracle, rollouts to 90 % of the oracle's gain over 300): "
                         f"old {fmt(gap_old)}, new {fmt(gap)}")
        lines.append("")
    if any("poison" in r for r in results):
        rows = [r["poison"] for r in results if "poison" in r]
        lines.append("Poisoning: first-draw probability of the worst optimization of the most visited state, after n records")
        lines.append("credited against a verified parent 100x slower than the reference, from one client (KB: aligned, 900 rollouts)")
        lines.append(f"{'rule':<10}{'n = 0':>18}{'n = 1':>18}{'n = 4':>18}")
        for name in ("old rule", "new rule"):
            lines.append(f"{name:<10}" + "".join(f"{fmt([row[name][i] for row in rows], 3):>18}" for i in range(3)))
        lines.append("")
    for key, what in (("drift", "each state's best optimization stops paying (its effect drops to the state's worst)"),
                      ("drift_shuffle", "each state's effects are dealt out again (nothing learnt stays true)")):
        rows = [r[key] for r in results if key in r]
        if not rows:
            continue
        lines.append(f"Drift ({key}: aligned priors; after {cfg.drift_rollouts // 2} of {cfg.drift_rollouts} rollouts {what}):")
        lines.append("share of the oracle's gain by problems of a state since the change")
        ks = [1, 3, 5, 10, 15, 20, 30]
        lines.append(f"{'rule':<10}{'before':>16}" + "".join(f"{'+' + str(k):>16}" for k in ks) + f"{'recovered by':>14}")
        for name in ("uniform", "old rule", "new rule"):
            pre = [statistics.fmean([row[name][k] for k in range(-10, 0) if k in row[name]]) for row in rows]
            cells = [fmt(pre)] + [fmt([row[name].get(k, math.nan) for row in rows]) for k in ks]
            lines.append(f"{name:<10}" + "".join(f"{c:>16}" for c in cells) + f"{recovery(rows, name):>14}")
        lines.append("")
    if any("multistep" in r for r in results):
        rows = [r["multistep"] for r in results if "multistep" in r]
        names = list(rows[0]["final"])
        lines.append(f"Multi-step ({cfg.problems} problems of {cfg.horizon} steps, aligned priors; the later half): "
                     "final log-speedup per problem, steps to 90 % of it, share of steps re-applying the lineage")
        lines.append(f"{'rule':<30}{'final log-speedup':>20}{'steps to 90 %':>18}{'re-applied':>16}")
        for name in names:
            lines.append(f"{name:<30}{fmt([row['final'][name] for row in rows]):>20}{fmt([row['to90'][name] for row in rows]):>18}"
                         f"{fmt([row['reapplied'][name] for row in rows]):>16}")
        lines.append("")
    if any("transfer" in r for r in results):
        rows = [r["transfer"] for r in results if "transfer" in r]
        lines.append(f"Transfer (uninformative priors, trained on {cfg.train} rollouts of set A): share on the first "
                     f"{cfg.test} rollouts of set B, trained minus fresh KB")
        for mode in ("shared states", "disjoint states"):
            lines.append(f"{mode:<18}" + "".join(f"{name}: {fmt([row[mode][name] for row in rows])}   " for name in ("old rule", "new rule")))
        lines.append("")
    if any("arch" in r for r in results):
        rows = [r["arch"] for r in results if "arch" in r]
        names = list(rows[0]["hopper"])
        lines.append(f"Cross-arch (two families, truths correlated {ARCH_CORRELATION}, uninformative priors): share over the "
                     f"last third of {cfg.rollouts} rollouts")
        for family in ARCHES:
            lines.append(f"{family:<10}" + "".join(f"{name}: {fmt([row[family][name] for row in rows])}   " for name in names))
        lines.append("")
    text = "\n".join(lines)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.txt").write_text(text + "\n")
    (out_dir / "results.json").write_text(json.dumps(results, default=str))
    plot(results, cfg, out_dir)
    return text


def recovery(rows: Sequence[dict[str, Any]], name: str) -> str:
    """Problems after the change until the 3-problem mean share is back at 90 % of the level before."""
    pre = statistics.fmean(statistics.fmean([row[name][k] for k in range(-10, 0) if k in row[name]]) for row in rows)
    curve = {k: statistics.fmean(row[name][k] for row in rows if k in row[name]) for k in range(1, 31)
             if any(k in row[name] for row in rows)}
    for k in range(1, 29):
        window = [curve[j] for j in (k, k + 1, k + 2) if j in curve]
        if len(window) == 3 and statistics.fmean(window) >= 0.9 * pre:
            return str(k)
    return "> 28"


def plot(results: list[dict[str, Any]], cfg: Config, out_dir: Path) -> None:
    """Learning curves, drift recovery, poisoning and multi-step bars, as PNG files in out_dir."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"uniform": "tab:gray", "old rule": "tab:orange", "new rule": "tab:blue"}
    bandit = [r["bandit"] for r in results if "bandit" in r]
    kinds = [k for k in cfg.kinds if bandit and k in bandit[0]]
    if kinds:
        fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.6), sharey=True, squeeze=False)
        axes = axes[0]
        for ax, kind in zip(axes, kinds):
            for name, colour in colours.items():
                curves = [b[kind]["curve"][name] for b in bandit if kind in b]
                xs = [50 * (i + 1) for i in range(len(curves[0]))]
                stats = [interval([c[i] for c in curves]) for i in range(len(xs))]
                ax.plot(xs, [m for m, _ in stats], label=name, color=colour)
                ax.fill_between(xs, [m - h for m, h in stats], [m + h for m, h in stats], color=colour, alpha=0.2)
            ax.axhline(1.0, color="black", lw=0.8, ls="--", label="oracle")
            ax.set_title(f"{kind} priors")
            ax.set_xlabel("rollout")
        axes[0].set_ylabel("share of oracle gain (50-rollout window)")
        axes[0].legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(out_dir / "bandit_learning.png", dpi=120)
        plt.close(fig)
    drift_rows = [r["drift"] for r in results if "drift" in r]
    if drift_rows:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for name, colour in colours.items():
            ks = sorted({k for row in drift_rows for k in row[name]})
            stats = [interval([row[name][k] for row in drift_rows if k in row[name]]) for k in ks]
            ax.plot(ks, [m for m, _ in stats], label=name, color=colour)
            ax.fill_between(ks, [m - h for m, h in stats], [m + h for m, h in stats], color=colour, alpha=0.2)
        ax.axvline(0.5, color="black", lw=0.8, ls=":")
        ax.set_xlabel("problems of a state since the truth changed")
        ax.set_ylabel("share of oracle gain")
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(out_dir / "drift.png", dpi=120)
        plt.close(fig)
    poison = [r["poison"] for r in results if "poison" in r]
    if poison:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for name in ("old rule", "new rule"):
            stats = [interval([p[name][i] for p in poison]) for i in range(3)]
            ax.errorbar([0, 1, 4], [m for m, _ in stats], yerr=[h for _, h in stats], label=name, color=colours[name],
                        marker="o", capsize=3)
        ax.axhline(0.1, color="black", lw=0.8, ls="--")
        ax.set_xlabel("poisoned records from one client")
        ax.set_ylabel("first-draw probability of the harmful optimization")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "poisoning.png", dpi=120)
        plt.close(fig)
    multi = [r["multistep"] for r in results if "multistep" in r]
    if multi:
        names = list(multi[0]["final"])
        fig, ax = plt.subplots(figsize=(7, 3.6))
        stats = [interval([m["final"][n] for m in multi]) for n in names]
        ax.bar(range(len(names)), [m for m, _ in stats], yerr=[h for _, h in stats], capsize=3)
        ax.set_xticks(range(len(names)), names, rotation=15)
        ax.set_ylabel("final log-speedup per problem")
        fig.tight_layout()
        fig.savefig(out_dir / "multistep.png", dpi=120)
        plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=20, help="worlds to average over (default 20)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--regimes", nargs="+", default=list(Config.regimes), choices=list(Config.regimes))
    p.add_argument("--rollouts", type=int, default=900)
    p.add_argument("--kinds", nargs="+", default=list(Config.kinds), choices=list(Config.kinds),
                   help="prior kinds of the bandit regime")
    p.add_argument("--quick", action="store_true", help="fewer rollouts and problems (a smoke run, not the figures)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (seeds run in parallel)")
    p.add_argument("--out", type=Path, default=Path("out/learning_sim"), help="folder for summary.txt, results.json, plots")
    p.add_argument("--tmp", default="/dev/shm" if Path("/dev/shm").is_dir() else None,
                   help="where the KB files live while running (a RAM disk keeps fsync cheap)")
    args = p.parse_args(argv)
    cfg = Config(rollouts=args.rollouts, kinds=tuple(args.kinds), regimes=tuple(args.regimes), tmp=args.tmp)
    if args.quick:
        cfg = Config(rollouts=min(args.rollouts, 450), kinds=tuple(args.kinds), regimes=tuple(args.regimes),
                     drift_rollouts=600, problems=40, train=150, test=60, tmp=args.tmp)
    started = time.monotonic()
    jobs = [(seed, cfg) for seed in range(args.first_seed, args.first_seed + args.seeds)]
    results: list[dict[str, Any]] = []
    if args.jobs > 1:
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            for res in pool.imap_unordered(run_seed, jobs):
                results.append(res)
                print(f"  seed {res['seed']} done in {res['wall_s']:.0f} s ({len(results)}/{len(jobs)})", file=sys.stderr, flush=True)
    else:
        for job in jobs:
            results.append(run_seed(job))
            print(f"  seed {results[-1]['seed']} done in {results[-1]['wall_s']:.0f} s ({len(results)}/{len(jobs)})",
                  file=sys.stderr, flush=True)
    results.sort(key=lambda r: r["seed"])
    print(report(results, cfg, args.out, time.monotonic() - started))
    print(f"\nplots and raw results: {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
