"""A kernel's lineage: the optimizations already applied on the way to it, read from the KB.

Every recorded outcome names the candidate it produced, the optimization applied and (when the
agent gave it) the parent candidate it started from, so the KB can walk from a kernel back to the
reference. An optimization anywhere on that path is already in the kernel: suggesting it again
re-applies what the kernel has.
"""

from __future__ import annotations

from kb_mcp.kb.view import KBView

MAX_DEPTH = 256
"""Ancestors followed at most (a chain longer than any real campaign; bounds a forged cycle's cost)."""


def lineage_optimizations(view: KBView, candidate_id: str) -> list[str]:
    """Optimization ids applied on the way to `candidate_id` (its own outcomes' first), no repeats.

    Every outcome recorded for the kernel or an ancestor counts, whatever its verdict: a failed
    candidate an agent kept working from still holds the change. Cycles (a forged parent) end the walk.
    """
    seen_candidates: set[str] = set()
    found: dict[str, None] = {}
    frontier = [candidate_id]
    while frontier and len(seen_candidates) < MAX_DEPTH:
        cid = frontier.pop(0)
        if cid in seen_candidates:
            continue
        seen_candidates.add(cid)
        for outcome in sorted(view.outcomes_for_candidate(cid), key=lambda o: o.created_at):
            found.setdefault(outcome.optimization_id, None)
            parent = outcome.parent_candidate_id
            if parent and parent not in seen_candidates:
                frontier.append(parent)
    return list(found)
