"""Baseline timings of a problem's reference: eager PyTorch and torch.compile, measured by the same
timer as candidates, in the same worker, and cached per (problem hash, GPU name, torch version,
precision track): the strict fp32 track times them with TF32 off, the others with it allowed
(`harness.worker.tracks`), so one track's figure is never another's baseline.

A first torch.compile costs seconds (16 s for a small MLP on an H100), so the cache is what keeps
a warm verdict fast. The cache is a JSON file per key under `<cache>/baselines`, written
atomically under a file lock, so several workers and servers share it safely. The reference's own op sets
(`ReferenceOps`, composed mode's allowance: `harness.judgment.composed`) are cached beside them the
same way, under `<cache>/reference_ops`. A measurement
that failed (torch.compile cannot compile the model) is cached too, with its reason.

Only the pool stores a baseline, and only one measured while the verification held the GPU alone
(the machine-wide GPU lane, `harness.gpu.lane`): a figure measured beside another process's work would
skew every later speedup of the problem. A result whose baseline was not stored says why
(`Timings.baseline_not_cached`).

A cached figure is only as good as the minute it was taken in. GPU-bound calls time the same
within ~6 % across processes and minutes on the H100; launch-bound ones (the host issuing many
small kernels) move by up to 1.9x (`bench/timing_env_probe.py`, docs/benchmarks.md). So the
harness re-times a launch-bound reference beside each candidate (`launch_bound` says which) and
uses the cached figure as it is only for GPU-bound ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness.gpu.memory import Footprint, TooLarge, gib
from kb_mcp.kb.atomic import write_atomic

PROTOCOL = 2  # bump when the timing protocol changes, so stale baselines are re-measured (2: issue time)

# A call is launch-bound when the host was still issuing it (launching kernels, running Python)
# for at least this fraction of its event time: then the GPU waited on the host, and the call's
# time moves with the host's speed. A GPU-bound call issues its few launches early and then waits
# for the GPU; the 40-launch eager chain (`elementwise_chain_small`) is still issuing near its end.
LAUNCH_BOUND_FRACTION = 0.5
# A reference re-timed beside the candidate may come out slower than its cached figure by at most
# this factor (the widest spread measured on one host is 1.9x); beyond it the cached figures
# stand, so that a reference slowed down from inside the process cannot make a speedup.
MAX_EAGER_DRIFT = 2.5


def launch_bound(event_ms: float, issue_ms: float | None) -> bool:
    """True when the host's issue time is at least `LAUNCH_BOUND_FRACTION` of the event time
    (medians of one series, `timing.RunStats`). Unknown issue time: False."""
    if issue_ms is None or event_ms <= 0:
        return False
    return issue_ms >= LAUNCH_BOUND_FRACTION * event_ms


def best_of(eager_ms: float, compile_ms: float | None) -> float:
    """The time a candidate must beat to be faster: the better of eager's and torch.compile's (None:
    not measured, or not wanted)."""
    return eager_ms if compile_ms is None else min(eager_ms, compile_ms)


def not_cached(why: str) -> str:
    """What a result says of a baseline it measured that was not cached because the measurement did
    not hold the GPU alone (the machine-wide GPU lane, `harness.gpu.lane`): `why` says why it did not."""
    return (f"the baseline measured in this run was not cached: it did not hold the GPU alone ({why}); "
            "the next verification of this problem measures it again")


class Baseline(BaseModel):
    """Median times of the reference (milliseconds) on one GPU with one torch version."""

    model_config = ConfigDict(extra="forbid")

    problem_hash: str
    device: str
    torch_version: str
    eager_ms: float
    eager_runs: int
    eager_issue_ms: float | None = None  # median host time to issue the eager call (see `launch_bound`)
    # eager's device time (`kernels.DeviceTime`), measured in the census worker; added to a cached
    # baseline by the server where it lacks it (files written before it existed are kept)
    eager_device_ms: float | None = None
    compile_ms: float | None = None  # None: not measured, or torch.compile failed (see compile_note)
    compile_runs: int = 0
    compile_note: str = ""
    track: str = "fp32"  # the precision track whose numerics it was timed in (`harness.worker.tracks`)
    numerics: dict[str, str | bool] = {}  # the TF32 settings it was timed under, as the worker read them
    protocol: int = PROTOCOL
    measured_at: str = ""

    @property
    def launch_bound(self) -> bool:
        """Whether eager is launch-bound, so that this figure must be re-timed beside a candidate."""
        return launch_bound(self.eager_ms, self.eager_issue_ms)

    def turns_at(self, want_compile: bool) -> float:
        """The candidate time at which the verdict against these figures turns (`best_of`)."""
        return best_of(self.eager_ms, self.compile_ms if want_compile else None)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:60]


class BaselineCache:
    """Baselines on disk, one file per (problem hash, GPU, torch version)."""

    def __init__(self, cache_dir: Path) -> None:
        self.dir = cache_dir / "baselines"

    def path(self, problem_hash: str, device: str, torch_version: str, track: str = "fp32") -> Path:
        """Where the baseline for this key lives (the strict track's files keep their old names)."""
        suffix = "" if track == "fp32" else f"-{_slug(track)}"
        return self.dir / f"{problem_hash}-{_slug(device)}-{_slug(torch_version)}{suffix}.json"

    def get(self, problem_hash: str, device: str, torch_version: str, need_compile: bool,
            track: str = "fp32") -> Baseline | None:
        """The cached baseline, or None when missing, stale, or lacking a wanted torch.compile time."""
        p = self.path(problem_hash, device, torch_version, track)
        try:
            b = Baseline.model_validate_json(p.read_text())
        except (OSError, ValueError):
            return None
        if b.protocol != PROTOCOL or b.track != track:
            return None
        if need_compile and b.compile_ms is None and not b.compile_note:
            return None
        return b

    def put(self, baseline: Baseline) -> None:
        """Stores a baseline (atomically; a concurrent writer of the same key simply wins)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        p = self.path(baseline.problem_hash, baseline.device, baseline.torch_version, baseline.track)
        if not baseline.measured_at:
            baseline = baseline.model_copy(update={"measured_at": datetime.now(timezone.utc).isoformat()})
        with FileLock(str(p) + ".lock"):
            write_atomic(p, json.dumps(baseline.model_dump(mode="json"), indent=1))

    def add_reference_device(self, cached: Baseline | None, device_ms: float | None) -> None:
        """Adds the reference's device time to a cached baseline that lacks it (a new baseline gets
        it from the verify worker, which has the same census reply)."""
        if cached is None or cached.eager_device_ms is not None or device_ms is None:
            return
        self.put(cached.model_copy(update={"eager_device_ms": device_ms}))


BaselineStatus = Literal["ok", "too_large", "problem_error", "harness_error", "needs_gpu"]


class BaselineRun(BaseModel):
    """The outcome of timing one problem's baselines alone (`WorkerPool.baselines`; `kb-mcp eval --baselines`).

    `status`: `ok` (timed; `baseline` holds it), `too_large` (the problem's limit on this GPU, with
    the numbers), `problem_error` (the problem's own code failed), `harness_error` (the harness failed
    to answer: ours to fix), `needs_gpu` (no GPU here)."""

    model_config = ConfigDict(extra="forbid")

    problem: str
    problem_hash: str
    status: BaselineStatus
    baseline: Baseline | None = None
    footprint: Footprint | None = None
    too_large: TooLarge | None = None
    note: str = ""
    device: str = ""
    peak_bytes: int | None = Field(None, description="the most the worker's allocator reserved")
    device_peak_bytes: int | None = Field(None, description="the device's memory in use at its highest (NVML)")
    device_idle_bytes: int | None = Field(None, description="the device's memory in use when the run began")
    elapsed_s: float = 0.0
    phases: dict[str, float] = Field(default_factory=dict, description=(
        "seconds per step: waiting for the GPU lane (`lane`), for the worker to start (`worker_start`), the "
        "worker's own steps (`protocol.BaselineReply.phases`), the rest of the request (`request_rest`), and "
        "waiting for a worker started meanwhile (`worker_restart`)"))
    cached: bool = Field(False, description="found in the cache, not timed in this run")
    worker_retired: str = Field("", description="why the worker exited after the run and a new one started "
                                                "(something left running, the problem's failure); '' when it did not")

    @property
    def peak_gib(self) -> float | None:
        """The run's peak above the device's idle level where NVML told it, else the worker's own."""
        if self.device_peak_bytes is not None and self.device_idle_bytes is not None:
            return gib(self.device_peak_bytes - self.device_idle_bytes)
        return gib(self.peak_bytes)


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
