"""Reads a `.ncu-rep` with NVIDIA's `ncu_report` module and prints its launches as JSON.

    python -m kb_mcp.harness.worker.ncu_report_reader MODULE_DIR REPORT

Run by `profiling.ncu_import` inside the sandbox: the report is a user's file and the module parses it
in native code, so neither happens in the server's process. One JSON list on stdout, one object per
profiled launch in report order (id, full_name, grid, block, metrics, texts, cc); values as the report
stores them (base units).
"""

from __future__ import annotations

import importlib
import json
import sys
from types import ModuleType
from typing import Any


def read_with_module(module: ModuleType, report: str) -> list[dict[str, Any]]:
    """One record per profiled launch, in report order."""
    ctx = module.load_report(report)
    records: list[dict[str, Any]] = []
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            records.append(_action_record(module, rng.action_by_idx(a), len(records)))
    return records


def _action_record(module: ModuleType, action: Any, index: int) -> dict[str, Any]:
    metrics: dict[str, float] = {}
    texts: dict[str, str] = {}
    for name in action.metric_names():
        value = _metric_value(action, name)
        if isinstance(value, str):
            texts[name] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[name] = float(value)
    try:
        full_name = action.name(module.IAction.NameBase_DEMANGLED)
    except (AttributeError, TypeError):
        full_name = action.name()

    def dim3(prefix: str) -> list[int]:
        return [int(metrics.get(f"{prefix}_{axis}", 1)) for axis in "xyz"]

    major = metrics.get("device__attribute_compute_capability_major")
    minor = metrics.get("device__attribute_compute_capability_minor")
    return {"id": index, "full_name": str(full_name), "grid": dim3("launch__grid_dim"),
            "block": dim3("launch__block_dim"), "metrics": metrics, "texts": texts,
            "cc": f"{int(major)}.{int(minor or 0)}" if major is not None else ""}


def _metric_value(action: Any, name: str) -> object:
    """A metric's value as the report stores it (number or text); None when it has none."""
    metric = action.metric_by_name(name)
    if metric is None or (hasattr(metric, "has_value") and not metric.has_value()):
        return None
    try:
        return metric.value()
    except Exception:  # noqa: BLE001 - an instanced or otherwise unreadable metric: not one we read
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m kb_mcp.harness.worker.ncu_report_reader MODULE_DIR REPORT", file=sys.stderr)
        return 2
    sys.path.append(argv[0])  # the module loads its native part from beside it
    try:
        module = importlib.import_module("ncu_report")
    except ImportError as exc:
        print(f"ncu_report cannot be imported from {argv[0]}: {exc}", file=sys.stderr)
        return 3
    json.dump(read_with_module(module, argv[1]), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
