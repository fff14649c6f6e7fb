"""Phase ordering: what applying an optimization is likely to turn the kernel into, and what that is worth.

`record_outcome` counts transitions (state, optimization) -> next state. From them, each
optimization of a state gets the distribution of where it led, with STAY_PRIOR pseudo-moves of
staying in the same state (so one observed move does not make a certainty), and a follow-on worth:

    follow_on = LOOKAHEAD * (sum over s' of P(s' | state, optimization) * V(s') - V(state))

where V(s) is the best posterior expected utility among s's candidates (0 if none is positive: an
agent can always stop). An optimization that historically leads to states where much is left to
gain is preferred over one of equal immediate worth that leads where little is; with no recorded
transitions the term is zero, and selection is unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kb_mcp.kb.models import ALL_ARCH, DEFAULT_TRACK, Track
from kb_mcp.kb.view import KBView
from kb_mcp.policy.select import CalibrationSums, calibrate, expected_utility

LOOKAHEAD = 0.5
"""Weight of the next state's worth relative to this step's own (a discount factor)."""
STAY_PRIOR = 2.0
"""Pseudo-moves into the same state added to each optimization's recorded transitions."""


@dataclass(frozen=True)
class Lead:
    """One state an optimization led to, and how often."""

    state_id: str
    share: float  # estimated probability (with the stay prior)
    count: int  # transitions recorded


def state_value(
    view: KBView, state_id: str, arch: str = ALL_ARCH, track: Track = DEFAULT_TRACK, base: CalibrationSums | None = None
) -> float:
    """What one more step in `state_id` is expected to gain at best (never below 0)."""
    pool = view.candidates(state_id, arch, track)
    cal = calibrate(pool, base)
    return max([0.0, *(expected_utility(s, calibration=cal) for s in pool)])


def leads(view: KBView, state_id: str) -> dict[str, list[Lead]]:
    """Per optimization id: the recorded next states, most frequent first (shares with the stay prior)."""
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for tr in view.transitions(state_id):
        counts[tr.optimization_id][tr.next_state_id] = tr.count
    out: dict[str, list[Lead]] = {}
    for opt, moves in counts.items():
        total = sum(moves.values()) + STAY_PRIOR
        rows = [
            Lead(state_id=s, share=(n + (STAY_PRIOR if s == state_id else 0.0)) / total, count=n) for s,
            n in moves.items()
        ]
        rows.sort(key=lambda r: (-r.count, r.state_id))
        out[opt] = rows
    return out


def follow_on(
    view: KBView,
    state_id: str,
    arch: str = ALL_ARCH,
    track: Track = DEFAULT_TRACK,
    *,
    lookahead: float = LOOKAHEAD,
    known: dict[str, list[Lead]] | None = None,
    base: CalibrationSums | None = None,
) -> dict[str, float]:
    """Per optimization id with recorded transitions: the follow-on worth (see module doc)."""
    by_opt = leads(view, state_id) if known is None else known
    if not by_opt or lookahead <= 0:
        return {}
    values: dict[str, float] = {}

    def value(s: str) -> float:
        if s not in values:
            values[s] = state_value(view, s, arch, track, base)
        return values[s]

    here = value(state_id)
    out = {}
    for opt, rows in by_opt.items():
        stay = 1.0 - sum(r.share for r in rows if r.state_id != state_id)
        expected = stay * here + sum(r.share * value(r.state_id) for r in rows if r.state_id != state_id)
        out[opt] = lookahead * (expected - here)
    return out
