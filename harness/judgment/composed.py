"""Composed mode (docs/harness.md, "Composed mode"): what a candidate for a model may keep of PyTorch.

In composed mode a candidate may run the PyTorch compute ops that the reference itself runs, as long
as at least one kernel of its own runs; any other op stays a `library_call`. The reference's own op
set is recorded twice, each at the level one of the runtime guards judges the candidate at, so both
sides are compared in the same spelling:

* `dispatch`: the ATen ops the op recorder (`harness.worker.ops.OpRecorder`, a dispatch mode) sees
  one forward of the reference run, before any candidate code runs in the verify worker (e.g.
  `aten::native_layer_norm`, `aten::addmm`, `aten::convolution`);
* `kernels`: the PyTorch ops that launched GPU kernels in one forward of the reference under the
  profiler, in a census worker no candidate has run in (`harness.judgment.kernels.kernel_ops`: e.g.
  `aten::cudnn_convolution`, which the dispatch mode never sees below `aten::convolution`).

Both are cached per (problem hash, GPU, torch version, track), like the baselines: the workers read
the cache (read-only in their sandbox) and send what they recorded back; the pool stores it. Plain
pydantic, no torch: the server reads and writes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness.judgment.kernels import op_packet
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.models import Mode

__all__ = ["COMPOSED", "ReferenceOps", "ReferenceOpsCache", "coverage_note", "kept_packets"]

COMPOSED: Mode = "composed"


class ReferenceOps(BaseModel):
    """The reference's own op set on one GPU with one torch version, at both levels (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    problem_hash: str
    device: str
    torch_version: str
    track: str = "fp32"
    dispatch: list[str] | None = Field(None, description="ATen ops the op recorder saw (`ns::packet`); None: not yet")
    kernels: list[str] | None = Field(None, description="PyTorch ops that launched kernels; None: not yet")
    recorded_at: str = ""


def kept_packets(ops: Iterable[str] | None) -> frozenset[str]:
    """The overload-packet names of recorded ops (`aten::addmm` -> `addmm`), as an allowance."""
    return frozenset(op_packet(op) for op in ops or ())


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:60]


class ReferenceOpsCache:
    """Reference op sets on disk, one file per (problem hash, GPU, torch version, track)."""

    def __init__(self, cache_dir: Path) -> None:
        self.dir = cache_dir / "reference_ops"

    def path(self, problem_hash: str, device: str, torch_version: str, track: str = "fp32") -> Path:
        """Where the op set of this key lives."""
        return self.dir / f"{problem_hash}-{_slug(device)}-{_slug(torch_version)}-{_slug(track)}.json"

    def get(self, problem_hash: str, device: str, torch_version: str, track: str = "fp32") -> ReferenceOps | None:
        """The cached op sets, or None when none was recorded (or the file is unreadable)."""
        try:
            return ReferenceOps.model_validate_json(self.path(problem_hash, device, torch_version, track).read_text())
        except (OSError, ValueError):
            return None

    def add(self, problem_hash: str, device: str, torch_version: str, track: str = "fp32", *,
            dispatch: Collection[str] | None = None, kernels: Collection[str] | None = None) -> ReferenceOps:
        """Stores what was recorded (either level, or both) beside what the cache holds, atomically."""
        self.dir.mkdir(parents=True, exist_ok=True)
        p = self.path(problem_hash, device, torch_version, track)
        with FileLock(str(p) + ".lock"):
            held = self.get(problem_hash, device, torch_version, track) or ReferenceOps(
                problem_hash=problem_hash, device=device, torch_version=torch_version, track=track)
            update: dict[str, object] = {"recorded_at": datetime.now(timezone.utc).isoformat()}
            if dispatch is not None:
                update["dispatch"] = sorted(set(dispatch))
            if kernels is not None:
                update["kernels"] = sorted(set(kernels))
            held = held.model_copy(update=update)
            write_atomic(p, json.dumps(held.model_dump(mode="json"), indent=1))
        return held


def coverage_note(coverage: float | None) -> str:
    """How a composed verdict's summary states its coverage."""
    if coverage is None:
        return "composed mode (coverage not measured)"
    return f"composed mode: {coverage:.0%} of its GPU time in its own kernels"
