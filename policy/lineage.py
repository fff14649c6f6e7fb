"""A kernel's lineage, read from the KB: the optimizations already applied on the way to it, and where
it started (what `policy.credit` measures a credit from).

Every recorded outcome names the candidate it produced, the optimization applied and (when the
agent gave it) the parent candidate it started from, so the KB can walk from a kernel back to the
reference. An optimization anywhere on that path is already in the kernel: suggesting it again
re-applies what the kernel has. Only outcomes recorded by a client that verified their candidate
(`KBView.made_outcomes`) say how it was made: another client's records cannot change a lineage.
"""

from __future__ import annotations

from kb_mcp.kb.models import CandidateRecord
from kb_mcp.kb.view import KBView
from kb_mcp.policy.credit import Lineage

MAX_DEPTH = 256
"""Ancestors followed at most (a chain longer than any real campaign; bounds a forged cycle's cost)."""


def lineage_optimizations(view: KBView, candidate_id: str) -> list[str]:
    """Optimization ids applied on the way to `candidate_id` (its own outcomes' first), no repeats.

    Every outcome its verifiers recorded for the kernel or an ancestor counts, whatever its verdict: a
    failed candidate an agent kept working from still holds the change. Cycles (a forged parent) end the walk.
    """
    seen_candidates: set[str] = set()
    found: dict[str, None] = {}
    frontier = [candidate_id]
    while frontier and len(seen_candidates) < MAX_DEPTH:
        cid = frontier.pop(0)
        if cid in seen_candidates:
            continue
        seen_candidates.add(cid)
        for outcome in view.made_outcomes(cid):
            found.setdefault(outcome.optimization_id, None)
            parent = outcome.parent_candidate_id
            if parent and parent not in seen_candidates:
                frontier.append(parent)
    return list(found)


def timed_verdict(view: KBView, candidate_id: str, problem_hash: str,
                  device: str | None = None) -> CandidateRecord | None:
    """The candidate's creditable, valid verdict of this problem with both its own and its reference's
    time (on `device` when given), or None: the only kind of verdict a credit may be measured from."""
    for rec in view.candidate_verdicts(candidate_id):
        if (rec.creditable and rec.verdict.is_valid and rec.problem_hash == problem_hash and rec.time_ms
                and rec.time_ms > 0 and rec.eager_ms and rec.eager_ms > 0 and (device is None or rec.device == device)):
            return rec
    return None


def _made_from(view: KBView, candidate_id: str) -> tuple[bool, str | None]:
    """Whether a recorded outcome produced the candidate, and the parent the first such outcome named
    (None: it started from the problem's reference). Later claims of other parents do not count."""
    made = view.made_outcomes(candidate_id)
    return (True, made[0].parent_candidate_id) if made else (False, None)


def start_of(view: KBView, parent: CandidateRecord, client: str) -> Lineage:
    """What the KB recorded of the lineage of a verified `parent` on its GPU (`policy.credit.Lineage`):
    the fastest kernel on the recorded path back to its root, the root, and the problem's first
    kernels by clients other than `client`.

    The walk follows each kernel's first recorded outcome to the parent it named. It ends at a kernel
    no outcome produced (the root), at an outcome that started from the problem's reference (the
    reference is the root), or where an ancestor has no usable verdict on this GPU, or a forged cycle
    or MAX_DEPTH is met (the last kernel reached is judged as a root)."""
    assert parent.time_ms is not None and parent.eager_ms is not None, "start_of needs a timed parent"
    node, best, seen = parent, parent.time_ms, {parent.candidate_id}
    root_ms, root_eager = parent.time_ms, parent.eager_ms
    while len(seen) < MAX_DEPTH:
        made, up = _made_from(view, node.candidate_id)
        if not made:
            break
        if up is None:  # the lineage started from the problem's reference
            assert node.eager_ms is not None
            root_ms = root_eager = node.eager_ms
            best = min(best, node.eager_ms)
            break
        rec = timed_verdict(view, up, parent.problem_hash, parent.device) if up not in seen else None
        if rec is None:
            break
        assert rec.time_ms is not None and rec.eager_ms is not None
        seen.add(up)
        node, best = rec, min(best, rec.time_ms)
        root_ms, root_eager = rec.time_ms, rec.eager_ms
    return Lineage(parent_ms=parent.time_ms, best_ms=best, root_ms=root_ms, root_eager_ms=root_eager,
                   peers=first_kernels(view, parent.problem_hash, client))


def first_kernels(view: KBView, problem_hash: str, client: str) -> tuple[float, ...]:
    """Slowness over the reference (time / eager) of the problem's first kernels that clients other
    than `client` started lineages from: roots (no outcome produced them) named as the parent of an
    outcome another client recorded. A client cannot make these: only other clients' records do."""
    found: dict[str, float] = {}
    looked: set[str] = set()
    for rec in view.problem_verdicts(problem_hash):
        if rec.candidate_id in looked:
            continue
        looked.add(rec.candidate_id)
        for outcome in view.made_outcomes(rec.candidate_id):
            root = outcome.parent_candidate_id
            if outcome.agent == client or not root or root in found or _made_from(view, root)[0]:
                continue
            timed = timed_verdict(view, root, problem_hash)
            if timed is not None and timed.time_ms and timed.eager_ms:
                found[root] = timed.time_ms / timed.eager_ms
    return tuple(found.values())
