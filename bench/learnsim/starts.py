"""Slow starts and slow parents: first kernels slower than the reference, and clients that verify a
deliberately slow parent to buy a harmful optimization credit. The shipped credit rule beside the one
before it (`policy.credit.EAGER_CAP`: every parent slower than the reference counts as the reference),
both through `tools.record_outcome` (see `bench/learning_sim.py`)."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

from kb_mcp.kb.models import Verdict
from kb_mcp.policy.credit import EAGER_CAP, SHIPPED, START_ALLOWANCE, CreditRule
from learnsim.regimes import bandit_stream, run_suppress, share
from learnsim.rules import LegacyRule, Step, ToolRule, copy_kb, new_kb
from learnsim.world import MALLORY, NOISE_SD, World, make_priors, make_world

START_KINDS = ("1-4x", "1-10x")
"""The start speeds of the `start` regime (`world.START_SPEEDS`); "as eager" is the bandit regime's."""
CREDIT_RULES: dict[str, CreditRule] = {"new rule": SHIPPED, "new rule, eager cap": EAGER_CAP}
"""The shipped policy with the shipped credit, and with the credit rule before it."""
ATTACKS = {"poisoning": 100.0, "sandbagging": START_ALLOWANCE}
"""How many times slower than the reference the attacker's parent is: 100x (the poisoning measured
since the first version), and as slow as the shipped rule counts a first kernel in full (the most a
sandbagging client gets from it per record)."""


def run_start(world: World, seed: int, folder: Path, rollouts: int) -> dict[str, Any]:
    """The bandit stream with aligned priors (the same states, problems and noise as the bandit
    regime's), each problem's first kernel 1-4x or 1-10x slower than the reference: share of the
    oracle's gain per third, per rule, and how far each credit rule's KB ends from the truth (`lean`)."""
    priors = make_priors(world, "aligned", seed)
    result: dict[str, Any] = {}
    for kind in START_KINDS:
        rules: dict[str, Any] = {"old rule": LegacyRule(priors)}
        for i, (name, rule) in enumerate(CREDIT_RULES.items()):
            rules[name] = ToolRule(new_kb(folder, f"start-{kind}-{i}", priors), credit=rule)
        out = bandit_stream(world, seed, rules, rollouts, tag="baligned", starts=kind)
        thirds = [(i * rollouts // 3, (i + 1) * rollouts // 3) for i in range(3)]
        result[kind] = {name: [share(out[name][lo:hi], out["oracle"][lo:hi]) for lo, hi in thirds]
                        for name in ("uniform", *rules)}
        result[kind]["lean"] = {name: rules[name].lean(world.mu) for name in CREDIT_RULES}
    return result


def run_poison(world: World, seed: int, folder: Path, bandit: dict[str, Any]) -> dict[str, Any]:
    """One client credits the worst optimization of the most visited state, four times, each against
    a parent it verified deliberately slow (`ATTACKS`; the first kernel of a fresh problem of its own),
    recording an ordinary candidate with the harmful change really applied and timed: the harmful
    optimization's first-draw probability after n = 0, 1, 4 records, per attack and rule, on copies of
    the bandit regime's aligned KB (the same for either credit rule: its parents were the reference)."""
    counts = bandit["_state_counts"]
    s = max(counts, key=lambda k: (counts[k], k))
    h = min(world.options[s], key=lambda a: world.mu[(s, a)])
    out: dict[str, Any] = {"state": s, "harmful": h, "true_mu": world.mu[(s, h)]}
    for attack, slowness in ATTACKS.items():
        legacy: LegacyRule = copy.deepcopy(bandit["_legacy_aligned"])
        tools = {name: ToolRule(copy_kb(Path(bandit["_kb_aligned"]), folder / f"{attack}-{i}.json"), client=MALLORY,
                                credit=rule) for i, (name, rule) in enumerate(CREDIT_RULES.items())}
        rows: dict[str, list[float]] = {"old rule": [], **{name: [] for name in tools}}
        noise = random.Random(f"poison-{seed}")
        for n in range(5):
            if n:
                x = world.mu[(s, h)] + noise.gauss(0, NOISE_SD)  # the harmful change, really applied and timed
                step = Step(state=s, arch="hopper", key=f"{seed}-{attack}-{n}", problem=f"mallory-{attack}{n}")
                for tool in tools.values():
                    slow = tool.first_kernel(step, slowness)  # verified, deliberately slow
                    tool.learn(step, h, Verdict.faster if x > 0 else Verdict.slower, x, client_parent=slow.parent,
                               parent_ms=1.0)
                legacy.record(s, h, "hopper", Verdict.faster, math.log(slowness) + x)
            if n in (0, 1, 4):
                options = world.options[s]
                rows["old rule"].append(legacy.probabilities(s, options, "hopper")[options.index(h)])
                for name, tool in tools.items():
                    rows[name].append(tool.first_draw(s, h, "hopper"))
        out[attack] = rows
    out["suppress"] = run_suppress(world, seed, folder, bandit, s)
    return out


def quick_starts(seed: int, rollouts: int, n_states: int, folder: Path, kind: str = "1-10x") -> dict[str, Any]:
    """The CPU test's check of this module: on a short aligned-prior stream restricted to the
    `n_states` most visited states, first kernels `kind` slower than the reference, the share of the
    oracle's gain over its last half per credit rule; then, on each rule's KB, a client's four
    sandbagging records (`ATTACKS`) crediting the worst optimization of the most visited of them, and
    its first-draw probability before and after."""
    world = make_world(seed)
    states = sorted(world.states, key=lambda s: -world.weights[world.states.index(s)])[:n_states]
    priors = make_priors(world, "aligned", seed)
    rules = {name: ToolRule(new_kb(folder, f"quick-start-{seed}-{i}", priors), credit=rule)
             for i, (name, rule) in enumerate(CREDIT_RULES.items())}
    out = bandit_stream(world, seed, rules, rollouts, tag="quick-start", states=states, starts=kind)
    half = rollouts // 2
    result: dict[str, Any] = {name: share(out[name][half:], out["oracle"][half:]) for name in (*rules, "uniform")}
    s = states[0]
    h = min(world.options[s], key=lambda a: world.mu[(s, a)])
    for name, rule in rules.items():
        attacker = ToolRule(rule.ctx.kb_path, client=MALLORY, credit=rule.credit)
        before = attacker.first_draw(s, h)
        noise = random.Random(f"quick-sandbag-{seed}")
        for n in range(4):
            x = world.mu[(s, h)] + noise.gauss(0, NOISE_SD)
            step = Step(state=s, arch="hopper", key=f"{seed}-quick-sandbag-{n}", problem=f"mallory-quick{n}")
            slow = attacker.first_kernel(step, ATTACKS["sandbagging"])
            attacker.learn(step, h, Verdict.faster if x > 0 else Verdict.slower, x, client_parent=slow.parent,
                           parent_ms=1.0)
        result[f"{name}: sandbagged"] = (before, attacker.first_draw(s, h))
    return result
