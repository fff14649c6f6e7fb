"""The reference implementation's KB shape, imported and exported:
``{"optimization_strategies": {state: {"primary_bottleneck", "secondary_characteristics": [...],
"optimizations": [{"technique", "description", "category", "predicted_speedup",
"confidence_score", "usage_count", ...}]}}, "discovered_states": {...}}``.

A reference entry becomes a prior: mean log(predicted_speedup), weight 4 x confidence_score
pseudo-samples, within the bounds of `kb.interchange` (`SPEEDUP_RANGE`, `MAX_PRIOR_WEIGHT`). Its
usage counts are that run's history, which this KB cannot verify, so they are reported, not counted
as measurements.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from kb_mcp.kb import ids
from kb_mcp.kb.interchange import (
    REFERENCE_WEIGHT_PER_CONFIDENCE,
    InterchangeError,
    TransferReport,
    bounded_speedup,
    detect_format,
)
from kb_mcp.kb.models import ALL_ARCH, Optimization, Primary, Score, Secondary, Signature, State
from kb_mcp.kb.store import KBStore
from kb_mcp.kb.view import KBView, Transaction

_PRIMARY_ALIASES = {
    "memory": Primary.memory, "memory_bound": Primary.memory, "bandwidth": Primary.memory,
    "compute": Primary.compute, "compute_bound": Primary.compute,
    "latency": Primary.latency, "latency_bound": Primary.latency, "occupancy": Primary.latency,
    "launch_overhead": Primary.launch_overhead, "api_overhead": Primary.launch_overhead,
    "overhead": Primary.launch_overhead,
    "launch": Primary.launch_overhead,
    "hybrid": Primary.hybrid, "balanced": Primary.hybrid, "mixed": Primary.hybrid,
    "host": Primary.host, "transfer": Primary.host, "transfers": Primary.host, "io": Primary.host,
}
_KNOWN_OPT_FIELDS = {
    "id", "technique", "description", "category", "predicted_speedup", "confidence_score", "usage_count",
    "success_count", "when_to_apply", "applicable_conditions", "cost", "tradeoffs", "follow_ups", "next_optimizations",
}


def _primary(text: Any) -> Primary | None:
    return _PRIMARY_ALIASES.get(ids.slug(str(text or "")))


def _secondary(chars: list[Any]) -> Secondary | None:
    for c in chars:
        try:
            return Secondary(ids.slug(str(c)))
        except ValueError:
            continue
    return None


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "; ".join(str(v) for v in value)
    return str(value or "")


def import_reference(store: KBStore, data: Any, *, source: str = "<reference>") -> TransferReport:
    """Adds the states, optimizations and prior scores of a reference-implementation KB.

    Existing states and optimizations (same id) are kept as they are; so are scores that exist
    here already. Returns what was added and what was ignored.
    """
    if detect_format(data) != "reference":
        raise InterchangeError(f"{source}: not a reference KB (no 'optimization_strategies' object)")
    report = TransferReport(source=source, format="reference")
    sections: list[tuple[str, Any, str]] = [(k, v, "imported") for k, v in data["optimization_strategies"].items()]
    discovered = data.get("discovered_states") or {}
    if isinstance(discovered, list):
        discovered = {str(d.get("name") or d.get("state_name") or i): d for i,
                      d in enumerate(discovered) if isinstance(d, dict)}
    if isinstance(discovered, dict):
        sections += [(k, v, "discovered") for k, v in discovered.items()]
    else:
        report.ignored.append("discovered_states: neither an object nor a list")
    with store.transaction() as tx:
        for name, entry, origin in sections:
            if not isinstance(entry, dict):
                report.ignored.append(f"state {name!r}: not an object")
                continue
            state_id = _import_state(tx, name, entry, origin, report)
            if state_id is None:
                continue
            for i, opt_entry in enumerate(entry.get("optimizations") or []):
                _import_optimization(tx, state_id, opt_entry, report, where=f"{name}.optimizations[{i}]")
    return report


def _import_state(tx: Transaction, name: str, entry: dict[str, Any], origin: str, report: TransferReport) -> str | None:
    state_id = str(entry.get("id") or ids.slug(name))
    if tx.get_state(state_id) is not None:
        return state_id
    primary = _primary(entry.get("primary_bottleneck"))
    if primary is None:
        report.ignored.append(f"state {name!r}: unknown primary_bottleneck {entry.get('primary_bottleneck')!r}")
        return None
    chars = entry.get("secondary_characteristics") or []
    chars = chars if isinstance(chars, list) else [chars]
    secondary = _secondary(chars)
    desc = _text(entry.get("description")) or (
        f"{primary.value} bound"
        + (f"; characteristics: {', '.join(map(str, chars))}" if chars else "")
        + " (imported)."
    )
    tx.put_state(
        State(
            id=state_id,
            name=str(entry.get("name") or name.replace("_", " ")),
            description=desc,
            signature=Signature(primary=primary, secondary=secondary),
            origin="discovered" if origin == "discovered" else "imported",
        )
    )
    report.states_added += 1
    return state_id


def _import_optimization(tx: Transaction, state_id: str, e: Any, report: TransferReport, where: str) -> None:
    if not isinstance(e, dict) or not (e.get("technique") or e.get("id")):
        report.ignored.append(f"{where}: no technique")
        return
    technique = str(e.get("technique") or e["id"])
    opt_id = str(e.get("id") or ids.slug(technique))
    extra = sorted(set(e) - _KNOWN_OPT_FIELDS)
    if extra:
        report.ignored.append(f"{where}: fields not carried over: {', '.join(extra)}")
    if e.get("usage_count"):
        report.ignored.append(
            f"{where}: usage_count {e.get('usage_count')} is the source's history, kept as prior weight only"
        )
    opt = tx.get_optimization(opt_id)
    if opt is None:
        follow = e.get("follow_ups") or e.get("next_optimizations") or []
        opt = Optimization(
            id=opt_id,
            name=technique,
            description=_text(e.get("description")) or technique,
            category=str(e.get("category") or "other"),
            when_helps=_text(e.get("when_to_apply") or e.get("applicable_conditions")),
            cost=_text(e.get("cost") or e.get("tradeoffs")),
            applicable_states=[state_id],
            follow_ups=[ids.slug(str(f)) for f in follow] if isinstance(follow, list) else [],
            origin="imported",
        )
        tx.put_optimization(opt)
        report.optimizations_added += 1
    if tx.get_score(state_id, opt_id, ALL_ARCH) is not None:
        return
    try:
        speedup = float(e.get("predicted_speedup") or 1.0)
        given = e.get("confidence_score")
        confidence = float(given if given is not None else 0.25)
    except (TypeError, ValueError):
        report.ignored.append(f"{where}: predicted_speedup/confidence_score not numbers")
        return
    speedup = bounded_speedup(speedup) if math.isfinite(speedup) else 1.0
    confidence = min(max(confidence, 0.0), 1.0) if math.isfinite(confidence) else 0.25
    tx.put_score(
        Score(
            state_id=state_id,
            optimization_id=opt_id,
            arch=ALL_ARCH,
            prior=True,
            prior_mean_log_speedup=math.log(speedup),
            prior_weight=max(0.1, REFERENCE_WEIGHT_PER_CONFIDENCE * confidence),
        )
    )
    report.scores_added += 1


def export_reference(view: KBView, state_ids: Iterable[str] | None = None) -> dict[str, Any]:
    """The KB (or the given states) in the reference implementation's shape; discovered states go
    under ``discovered_states``. Entries carry their kb-mcp ids, so re-importing them maps back."""
    strategies: dict[str, Any] = {}
    discovered: dict[str, Any] = {}
    wanted = list(state_ids) if state_ids is not None else view.state_ids()
    for sid in wanted:
        state = view.get_state(sid)
        if state is None:
            continue
        opts = []
        for score in view.scores(sid, ALL_ARCH):
            opt = view.get_optimization(score.optimization_id)
            if opt is None:
                continue
            opts.append(
                {
                    "id": opt.id,
                    "technique": opt.name,
                    "description": opt.description,
                    "category": opt.category,
                    "predicted_speedup": round(score.expected_speedup, 4),
                    "confidence_score": round(
                        min(1.0, (score.prior_weight + score.samples) / REFERENCE_WEIGHT_PER_CONFIDENCE), 4
                    ),
                    "usage_count": score.attempts,
                    "success_count": score.successes,
                }
            )
        entry = {
            "id": state.id,
            "name": state.name,
            "description": state.description,
            "primary_bottleneck": state.signature.primary.value,
            "secondary_characteristics": [state.signature.secondary.value] if state.signature.secondary else [],
            "optimizations": opts,
        }
        (discovered if state.origin == "discovered" else strategies)[state.id] = entry
    return {"optimization_strategies": strategies, "discovered_states": discovered}
