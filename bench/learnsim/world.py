"""The simulated world: hidden true effects per (state, optimization), problems, noisy outcomes,
prior kinds and the changes of truth of the drift regimes (see `bench/learning_sim.py`)."""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from kb_mcp.kb.models import Verdict
from kb_mcp.kb.seed import seed_scores, seed_states

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
START_SPEEDS = {"as eager": 1.0, "1-4x": 4.0, "1-10x": 10.0}
"""How much slower than the reference each problem's first kernel is: log-uniform between 1 and this."""



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
            other = ARCH_CORRELATION * m + math.sqrt(1 - ARCH_CORRELATION**2) * alt
            mu_alt[(s, a)] = max(-MAX_EFFECT, min(MAX_EFFECT, other))
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


def expected_gain(world: World, s: str, a: str, dev: dict[str, float], arch: str = "hopper",
                  lineage: frozenset[str] = frozenset()) -> float:
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



def start_slowness(kind: str, rng: random.Random) -> float:
    """A first kernel's time over the reference's, for the start speed `kind` (START_SPEEDS)."""
    top = START_SPEEDS[kind]
    return math.exp(rng.uniform(0.0, math.log(top))) if top > 1.0 else 1.0


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
