"""Classifications -> KB states, through the KB's own matching API (discovering a state for a
signature the KB lacks)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from kb_mcp.kb import matching
from kb_mcp.kb.models import State
from kb_mcp.kb.view import Transaction
from kb_mcp.policy.classify.models import KernelClassification


class StateAssignment(BaseModel):
    """The KB state a classification maps to."""

    model_config = ConfigDict(extra="forbid")

    key: str
    state: State
    matched_by: str  # 'signature' (same primary/secondary key) | 'discovered' (new state created now)
    distance: float = 0.0  # how far the metrics lie outside the state's ranges (0 = inside)


def assign_states(tx: Transaction, classifications: Iterable[KernelClassification]) -> dict[str, StateAssignment]:
    """Maps each distinct signature key to a KB state, creating a discovered state in `tx` for a key
    the KB lacks (one per key, inheriting its nearest state's optimizations). A classification that
    went without headline metrics (`missing`) only matches: a signature read partly from assumptions
    would add a state to the shared KB for good, for every agent, so such a key stays unassigned."""
    out: dict[str, StateAssignment] = {}
    for c in classifications:
        sig = c.signature()
        if sig is None or c.key in out:
            continue
        match = matching.match_state(tx, sig, c.metrics)
        if match is not None and match.exact:
            out[sig.key] = StateAssignment(key=sig.key, state=match.state, matched_by="signature",
                                           distance=round(match.distance, 4))
            continue
        if c.missing:
            continue
        state, created = matching.discover_state(tx, sig, metrics=c.metrics)
        out[sig.key] = StateAssignment(key=sig.key, state=state, matched_by="discovered" if created else "signature")
    return out
