"""The rules compared: the shipped policy through the real tools on a real KB file, and the old rule
replayed in memory with its exact arithmetic (see `bench/learning_sim.py`)."""

from __future__ import annotations

import math
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kb_mcp.kb.models import ALL_ARCH, CandidateRecord, Score, Verdict
from kb_mcp.kb.store import KBStore
from kb_mcp.policy import phase
from kb_mcp.policy.credit import SHIPPED, CreditRule
from kb_mcp.policy.select import CalibrationSums, first_draw_probabilities
from kb_mcp.tools import record_outcome, suggest_optimizations
from kb_mcp.tools.context import ToolContext
from learnsim.world import ARCHES, HONEST

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
    """The shipped policy: suggest_optimizations and record_outcome on a real KB file. `credit`: the
    credit rule record_outcome applies (the shipped one, or the rule before it, through the same code)."""

    name = "new rule"

    def __init__(self, kb: Path, client: str = HONEST, *, lineage: bool = True, arch_aware: bool = True,
                 phase_ordering: bool = True, credit: CreditRule = SHIPPED) -> None:
        self.ctx = ToolContext(kb, client_name=client, standby_profiler=False)
        self.lineage = lineage
        self.arch_aware = arch_aware
        self.phase_ordering = phase_ordering
        self.credit = credit

    def first_kernel(self, step: Step, slowness: float, *, key: str | None = None) -> Step:
        """`step` starting from the problem's first kernel, verified `slowness` times slower than the
        reference (a lineage root: no outcome produced it), instead of from the reference itself."""
        cid = f"r_{key or step.key}"
        arch, device = ARCHES[step.arch]
        with self.ctx.store.transaction() as tx:
            tx.put_candidate(CandidateRecord(
                candidate_id=cid, problem=step.problem, problem_hash=step.problem,
                verdict=Verdict.slower if slowness > 1.0 else Verdict.faster, arch=arch, device=device,
                time_ms=slowness, eager_ms=1.0,
            ))
        return replace(step, parent=cid, parent_ms=slowness)

    def choose(self, step: Step) -> str | None:
        req = suggest_optimizations.Request(
            state_id=step.state, arch=ARCHES[step.arch][0] if self.arch_aware else None,
            candidate_id=step.parent if self.lineage else None, exclude=sorted(step.tried), seed=seed_of(step.key),
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
        ), rule=self.credit)
        return cid

    def lean(self, truth: dict[tuple[str, str], float], arch: str = "hopper", min_weight: float = 4.0) -> float:
        """How far the KB's measured means lie from the true ones, on average (log units), over the
        scores of `arch`'s family holding at least `min_weight` samples' weight: what a credit rule's
        bias does to what is learnt (a problem's own deviation averages out over many problems)."""
        errors = []
        with self.ctx.store.read() as view:
            for state in view.state_ids():
                errors += [s.mean_log_speedup - truth[(state, s.optimization_id)]
                           for s in view.candidates(state, arch) if s.weight >= min_weight
                           and (state, s.optimization_id) in truth]
        return sum(errors) / len(errors) if errors else math.nan

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


def seed_of(key: str) -> int:
    """A repeatable integer seed for one rollout's draws."""
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

