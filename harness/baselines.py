"""Baseline timings of a problem's reference: eager PyTorch and torch.compile, measured by the same
timer as candidates, in the same worker, and cached per (problem hash, GPU name, torch version).

A first torch.compile costs seconds (16 s for a small MLP on an H100), so the cache is what keeps
a warm verdict fast. The cache is a JSON file per key under `<cache>/baselines`, written
atomically under a file lock, so several workers and servers share it safely. A measurement
that failed (torch.compile cannot compile the model) is cached too, with its reason.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock
from pydantic import BaseModel, ConfigDict

PROTOCOL = 1  # bump when the timing protocol changes, so stale baselines are re-measured


class Baseline(BaseModel):
    """Median times of the reference (milliseconds) on one GPU with one torch version."""

    model_config = ConfigDict(extra="forbid")

    problem_hash: str
    device: str
    torch_version: str
    eager_ms: float
    eager_runs: int
    compile_ms: float | None = None  # None: not measured, or torch.compile failed (see compile_note)
    compile_runs: int = 0
    compile_note: str = ""
    protocol: int = PROTOCOL
    measured_at: str = ""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:60]


class BaselineCache:
    """Baselines on disk, one file per (problem hash, GPU, torch version)."""

    def __init__(self, cache_dir: Path) -> None:
        self.dir = cache_dir / "baselines"

    def path(self, problem_hash: str, device: str, torch_version: str) -> Path:
        """Where the baseline for this key lives."""
        return self.dir / f"{problem_hash}-{_slug(device)}-{_slug(torch_version)}.json"

    def get(self, problem_hash: str, device: str, torch_version: str, need_compile: bool) -> Baseline | None:
        """The cached baseline, or None when missing, stale, or lacking a wanted torch.compile time."""
        p = self.path(problem_hash, device, torch_version)
        try:
            b = Baseline.model_validate_json(p.read_text())
        except (OSError, ValueError):
            return None
        if b.protocol != PROTOCOL:
            return None
        if need_compile and b.compile_ms is None and not b.compile_note:
            return None
        return b

    def put(self, baseline: Baseline) -> None:
        """Stores a baseline (atomically; a concurrent writer of the same key simply wins)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        p = self.path(baseline.problem_hash, baseline.device, baseline.torch_version)
        if not baseline.measured_at:
            baseline = baseline.model_copy(update={"measured_at": datetime.now(timezone.utc).isoformat()})
        with FileLock(str(p) + ".lock"):
            tmp = p.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(baseline.model_dump(mode="json"), indent=1))
            os.replace(tmp, p)
