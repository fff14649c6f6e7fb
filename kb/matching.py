"""From a signature to a KB state: exact key first, else the nearest state by metric ranges; and
the discovery of a new state for a signature the KB has not seen.

Metric names are the canonical names of `harness.profile_model.KernelMetrics` fields; a dict
field is addressed with a dot (``warp_stalls.long_scoreboard``). Values outside a state's range
count by how far outside they fall, relative to the metric's scale (100 for percentages).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from kb_mcp.kb import ids
from kb_mcp.kb.models import MetricRange, Score, Signature, State
from kb_mcp.kb.view import KBView, Transaction

# The secondary bottleneck is the more specific half of a signature (each belongs to one natural
# primary), so a state sharing the secondary is nearer than one sharing only the primary.
PRIMARY_MISMATCH = 0.5
SECONDARY_MISMATCH = 1.0
UNKNOWN_METRIC = 0.25  # a range whose metric the query does not report: mild doubt, not a miss
INHERIT_DISCOUNT = 0.5
"""A discovered state inherits its parent's expected log-speedups times this factor..."""
INHERIT_WEIGHT = 0.5
"""...and a prior weight of this many pseudo-samples: a guess to be overwritten quickly."""


class Match(BaseModel):
    """The KB state a signature maps to."""

    model_config = ConfigDict(extra="forbid")

    state: State
    exact: bool  # same primary/secondary key
    distance: float  # 0 = every reported metric inside the state's ranges
    confidence: float  # 0..1, from the distance


def flatten_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """{'dram_throughput_pct': 91.0, 'warp_stalls': {'barrier': 3.1}} -> dotted names to floats
    (None and non-numeric values dropped), the form `match_state` compares against ranges."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, Mapping):
            for sub, v in value.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    out[f"{name}.{sub}"] = float(v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    return out


def signature_values(signature: Signature) -> dict[str, float]:
    """Point values of a query signature's ranges (an observed signature has min == max)."""
    out: dict[str, float] = {}
    for r in signature.ranges:
        if r.min is not None and r.max is not None:
            out[r.metric] = (r.min + r.max) / 2
        elif r.min is not None or r.max is not None:
            out[r.metric] = r.min if r.min is not None else r.max  # type: ignore[assignment]
    return out


def signature_from_metrics(primary: Any, secondary: Any, metrics: Mapping[str, Any]) -> Signature:
    """An observed signature: the bottleneck pair plus each reported metric as a point range."""
    values = flatten_metrics(metrics)
    return Signature(
        primary=primary,
        secondary=secondary,
        ranges=[MetricRange(metric=k, min=v, max=v) for k, v in sorted(values.items())],
    )


def _scale(r: MetricRange) -> float:
    if r.metric.endswith("_pct"):
        return 100.0
    bound = r.min if r.min is not None else r.max
    return max(abs(bound or 0.0), 1.0)


def range_distance(ranges: list[MetricRange], values: Mapping[str, float]) -> float:
    """Mean over `ranges` of how far each value lies outside its range (0..1 per range)."""
    if not ranges:
        return UNKNOWN_METRIC
    total = 0.0
    for r in ranges:
        v = values.get(r.metric)
        if v is None:
            total += UNKNOWN_METRIC
        elif r.contains(v):
            continue
        else:
            gap = (r.min - v) if (r.min is not None and v < r.min) else (v - (r.max or 0.0))
            total += min(abs(gap) / _scale(r), 1.0)
    return total / len(ranges)


def signature_distance(query: Signature, state: State, values: Mapping[str, float] | None = None) -> float:
    """How far `query` is from `state`: bottleneck pair mismatch plus metric-range distance."""
    vals = signature_values(query) if values is None else values
    d = range_distance(state.signature.ranges, vals)
    if query.primary != state.signature.primary:
        d += PRIMARY_MISMATCH
    if query.secondary != state.signature.secondary:
        d += SECONDARY_MISMATCH
    return d


def _confidence(distance: float) -> float:
    return round(max(0.0, 1.0 - distance / (PRIMARY_MISMATCH + SECONDARY_MISMATCH + 1.0)), 4)


def nearest_state(view: KBView, signature: Signature, values: Mapping[str, float] | None = None) -> Match | None:
    """The closest state of the KB by `signature_distance` (seed states win ties), or None if empty."""
    vals = signature_values(signature) if values is None else values
    best: tuple[float, int, str] | None = None
    best_state: State | None = None
    for state in view.list_states():
        key = (signature_distance(signature, state, vals), 0 if state.origin == "seed" else 1, state.id)
        if best is None or key < best:
            best, best_state = key, state
    if best is None or best_state is None:
        return None
    return Match(state=best_state, exact=best_state.signature.key == signature.key, distance=best[0],
                 confidence=_confidence(best[0]))


def match_state(view: KBView, signature: Signature, metrics: Mapping[str, Any] | None = None) -> Match | None:
    """The state for `signature`: among states with the same key, the one whose ranges fit the
    metrics best; with no such state, the nearest one (`exact=False`). `metrics` (raw or flat)
    overrides the point values taken from the signature's ranges."""
    vals = flatten_metrics(metrics) if metrics is not None else signature_values(signature)
    same_key = view.states_with_key(signature.key)
    if same_key:
        scored = sorted(
            ((range_distance(s.signature.ranges, vals), 0 if s.origin == "seed" else 1, s.id, s) for s in same_key),
            key=lambda t: t[:3],
        )
        d, _, _, state = scored[0]
        return Match(state=state, exact=True, distance=d, confidence=_confidence(d))
    return nearest_state(view, signature, vals)


def inherited_score(parent: Score, state_id: str) -> Score:
    """A discovered state's prior, from its parent's score: discounted mean, small weight."""
    posterior = math.log(parent.expected_speedup) if parent.samples + parent.prior_weight > 0 else 0.0
    return Score(
        state_id=state_id,
        optimization_id=parent.optimization_id,
        arch=parent.arch,
        track=parent.track,
        prior=True,
        prior_mean_log_speedup=posterior * INHERIT_DISCOUNT,
        prior_weight=INHERIT_WEIGHT,
    )


def discover_state(
    tx: Transaction,
    signature: Signature,
    *,
    name: str | None = None,
    description: str | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> tuple[State, bool]:
    """The state for a signature whose key the KB lacks, created once (returns (state, created)).

    If a state with this key exists (another process discovered it first, or it is a seed state)
    it is returned unchanged. Otherwise a state with a deterministic id is added, inheriting the
    nearest state's optimizations at discounted prior scores, per arch family. Call inside a
    transaction so that the check and the creation are one atomic step.
    """
    vals = flatten_metrics(metrics) if metrics is not None else signature_values(signature)
    existing = match_state(tx, signature, metrics)
    if existing is not None and existing.exact:
        return existing.state, False
    sid = ids.discovered_state_id(signature)
    prior = tx.get_state(sid)
    if prior is not None:
        return prior, False
    parent = existing.state if existing is not None else None
    sec = signature.secondary.value if signature.secondary else "unspecified"
    state = State(
        id=sid,
        name=name or f"Discovered: {signature.primary.value} bound, {sec.replace('_', ' ')}",
        description=description
        or (
            f"A bottleneck pair ({signature.key}) that no earlier state had. "
            + (f"It started from the optimizations of the nearest known state, {parent.id} ({parent.name}), "
               "at discounted scores; measured outcomes here will correct them." if parent else "")
        ).strip(),
        signature=Signature(primary=signature.primary, secondary=signature.secondary,
                            ranges=_ranges_around(vals) or signature.ranges),
        origin="discovered",
        parent_id=parent.id if parent else None,
    )
    tx.put_state(state)
    if parent is not None:
        for arch, track in tx.score_keys(parent.id):
            for score in tx.scores(parent.id, arch, track):
                tx.put_score(inherited_score(score, sid))
    return state, True


def _ranges_around(values: Mapping[str, float]) -> list[MetricRange]:
    """Ranges for a discovered state: each observed metric +-10 % of its scale."""
    out = []
    for metric, v in sorted(values.items()):
        half = 10.0 if metric.endswith("_pct") else max(abs(v) * 0.25, 1.0)
        out.append(MetricRange(metric=metric, min=round(v - half, 4), max=round(v + half, 4)))
    return out
