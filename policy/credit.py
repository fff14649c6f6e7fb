"""What one outcome credits its optimization with: the speedup over where the kernel really started,
and how much that credit weighs.

`record_outcome` measures a candidate against the parent the caller names. The parent's time is the
server's own measurement, but which parent, and how slow it was made, are the caller's choices: a
client that verifies a deliberately slow parent, then records an ordinary candidate against it, would
buy the optimization it names any speedup it liked. Crediting every parent slower than the problem's
reference as the reference (the rule before this one) closes that, but it also credits an honest
lineage that starts slow (a first kernel without tiling, 3x slower than eager) with losses for the
very optimizations that fix it. So the credit rests on what a client cannot fake cheaply:

* **The lineage's own record.** A parent slower than the reference counts from the fastest kernel on
  its recorded path back to its lineage root (`Lineage.best_ms`): a kernel reached through recorded
  outcomes had every step of its slowdown credited, as a loss, to the optimization that caused it,
  and a lineage that was once faster than the reference counts from the reference at most. So a
  chain of recorded steps lends no start more slowness than its root had.
* **Where the root started.** The root (a verified first kernel, not produced by a recorded outcome)
  is the one time no outcome accounts for. Its slowness over the reference counts in full up to
  START_ALLOWANCE times; a root slower than that, or more than PEER_ALLOWANCE times slower than the
  problem's first kernels by other clients, weighs less: the credit keeps its value (an honest slow
  lineage is still credited with what it gained) but counts as a fraction of one outcome.
* **What rests on the start climbs slowly.** A credit is trusted as far as the candidate's own
  speedup over the reference (`Credit.trusted`), which the server timed side by side. What it claims
  beyond that, because its start was slow, counts only up to half a standard deviation above the
  score's estimate (`policy.update.START_SDS`), for the score and for its change detection alike:
  an honest slow lineage scatters around the truth and loses little, while a client repeating such
  claims lifts a score by a fraction of a deviation a record. The per-outcome band and the
  per-client cap hold as for any outcome.

`credit` is the one function that decides it; `record_outcome` reads the lineage and the peers from
the KB (`policy.lineage.start_of`) and never from a number an agent reports.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Literal

START_ALLOWANCE = 10.0
"""A lineage root up to this many times slower than the problem's reference counts in full: first
kernels without tiling or vectorization are commonly 1-10x slower than eager PyTorch."""
PEER_ALLOWANCE = 4.0
"""A root more than this many times slower than the median of the problem's first kernels by other
clients weighs less (as their slowness, floored at the reference's, over its own)."""
MIN_WEIGHT = 0.05
"""The least an outcome with a timed, verified candidate weighs: it still says something."""

CreditBasis = Literal["parent", "lineage_best", "parent_capped", "eager"]
"""What the speedup is measured from: the named parent; the fastest kernel of the parent's recorded
lineage (the parent was slower than it); the problem's reference in the parent's place (the lineage was
faster than the reference before, or the rule caps every parent at the reference); the reference
(no valid parent was named)."""


@dataclass(frozen=True)
class Lineage:
    """What the KB recorded of a named parent's lineage on one GPU, in ms (all server measurements)."""

    parent_ms: float
    best_ms: float
    """The fastest kernel on the recorded path from the lineage root to the parent (both included)."""
    root_ms: float
    root_eager_ms: float
    """The root's time and the problem's reference time measured beside it."""
    peers: tuple[float, ...] = ()
    """Slowness over the reference (time / eager) of the problem's first kernels by other clients."""

    @property
    def root_slowness(self) -> float:
        """How many times slower than the reference the lineage started."""
        return self.root_ms / self.root_eager_ms if self.root_eager_ms > 0 else 1.0


@dataclass(frozen=True)
class CreditRule:
    """The constants of the rule (the simulator compares variants through the same code)."""

    start_allowance: float = START_ALLOWANCE
    peer_allowance: float = PEER_ALLOWANCE
    eager_cap: bool = False
    """The rule before this one: every parent slower than the reference counts as the reference."""


SHIPPED = CreditRule()
EAGER_CAP = CreditRule(eager_cap=True)
"""The rule kb-mcp shipped before (`PARENT_SLACK = 1`): what the simulator compares against."""


@dataclass(frozen=True)
class Credit:
    """What one outcome credits: a speedup, what it is measured from and how much it weighs."""

    speedup: float
    basis: CreditBasis
    weight: float = 1.0
    """The outcome counts as this fraction of one sample (1: in full)."""
    trusted: float | None = None
    """The part of `speedup` that rests on no choice of the caller: the candidate's speedup over the
    problem's reference, timed beside it. None when all of it does (the parent was no slower than the
    reference); below `speedup` when the credit rests on a slow start, whose share beyond it
    `policy.update.apply_outcome` counts only up to a little above the score's estimate."""
    why: str = ""
    """One sentence for the caller when the basis or the weight is not the plain one."""


def start_weight(lineage: Lineage, rule: CreditRule = SHIPPED) -> tuple[float, str]:
    """How much a credit resting on this lineage's slow start weighs, and why (empty when in full).

    The root's slowness over the reference is the one thing no outcome accounts for: in full up to
    `rule.start_allowance`, and up to `rule.peer_allowance` times the median slowness of the
    problem's first kernels by other clients (where there are any); beyond either, the allowance over
    the slowness (a root 100x slower than eager weighs 0.1), never below MIN_WEIGHT."""
    slowness = lineage.root_slowness
    weight, why = 1.0, ""
    if slowness > rule.start_allowance:
        weight = rule.start_allowance / slowness
        why = (f"its lineage started {slowness:.3g}x slower than the problem's reference, beyond the "
               f"{rule.start_allowance:g}x a first kernel counts in full")
    if lineage.peers:
        typical = max(1.0, statistics.median(lineage.peers))
        if slowness > rule.peer_allowance * typical and rule.peer_allowance * typical / slowness < weight:
            weight = rule.peer_allowance * typical / slowness
            why = (f"its lineage started {slowness:.3g}x slower than the problem's reference, more than "
                   f"{rule.peer_allowance:g}x the problem's first kernels by other clients ({typical:.3g}x)")
    return max(MIN_WEIGHT, weight), why


def credit(candidate_ms: float, eager_ms: float | None, lineage: Lineage | None,
           rule: CreditRule = SHIPPED) -> Credit | None:
    """The credit of a candidate timed at `candidate_ms` (the reference beside it: `eager_ms`), started
    from the parent whose recorded lineage is `lineage` (None: no valid parent was named). None when
    there is nothing to measure against (no parent and no reference timing)."""
    if candidate_ms <= 0:
        return None
    if lineage is None:
        return Credit(eager_ms / candidate_ms, "eager") if eager_ms else None
    parent = lineage.parent_ms
    if not eager_ms or parent <= eager_ms:
        return Credit(parent / candidate_ms, "parent")
    if rule.eager_cap:
        return Credit(eager_ms / candidate_ms, "parent_capped",
                      why=f"the parent is {parent / eager_ms:.3g}x slower than the problem's reference; it counts "
                          "as the reference")
    basis = min(parent, max(eager_ms, lineage.best_ms))
    weight, why = start_weight(lineage, rule)
    if basis <= eager_ms:
        return Credit(eager_ms / candidate_ms, "parent_capped",
                      why=f"the parent is {parent / eager_ms:.3g}x slower than the problem's reference, and its "
                          "lineage was as fast as the reference before; it counts as the reference")
    if basis < parent:
        why = "; ".join(w for w in (f"the parent is slower than a kernel before it on its lineage "
                                     f"({parent / basis:.3g}x); the speedup counts from that kernel", why) if w)
    return Credit(basis / candidate_ms, "lineage_best" if basis < parent else "parent", weight=weight,
                  trusted=eager_ms / candidate_ms, why=why)
