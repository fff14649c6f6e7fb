"""The kernel census's profiler session (worker side): one call under the PyTorch profiler, its GPU
kernels each with the ATen op that launched it. Only the census worker starts a session; a process that
times candidates calls `forbid_profiler()`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from kb_mcp.harness.kernels import KernelCensus, KernelLaunch, classify_launches

ANNOTATION = "kbmcp::candidate_forward"

# A process that times candidates must never start a profiler session: after one, CUPTI can keep
# the host cost of every launch raised for the rest of the process (on an H100, eager
# elementwise_chain_small timed 0.62 ms in such a worker against 0.40 ms in a clean process), which
# inflates launch-bound baselines more than fused candidates and so overstates speedups. Timing
# workers call `forbid_profiler()` at start; the kernel census runs in a census worker of its own
# (`harness.census`).
_PROFILER_STATE = {"forbidden": False, "sessions": 0}


class ProfilerForbidden(RuntimeError):
    """A profiler session was asked for in a process that times candidates."""


def forbid_profiler() -> None:
    """Makes every later `profile_events` in this process raise `ProfilerForbidden`."""
    _PROFILER_STATE["forbidden"] = True


def profiler_sessions() -> int:
    """How many profiler sessions the harness started in this process."""
    return int(_PROFILER_STATE["sessions"])


class ProfilerEvent(BaseModel):
    """The fields of one raw profiler event that a census needs (recordable as a test fixture)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    device: str  # "cpu" | "cuda"
    correlation_id: int
    linked_correlation_id: int
    activity: str = ""  # e.g. "cpu_op", "kernel", "gpu_memcpy"; "" where this torch does not say


def profile_events(call: Callable[[], Any]) -> list[ProfilerEvent]:
    """Runs `call` once under the profiler (inside the `ANNOTATION` range) and returns its raw events."""
    from torch.profiler import ProfilerActivity, profile, record_function

    if _PROFILER_STATE["forbidden"]:
        raise ProfilerForbidden(
            "this process times candidates and must stay free of profiler sessions; the kernel census "
            "runs in the census worker (harness.census)"
        )
    _PROFILER_STATE["sessions"] += 1
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        with record_function(ANNOTATION):
            call()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return [
        ProfilerEvent(
            name=e.name(),
            device=_device_type(e),
            correlation_id=int(e.correlation_id()),
            linked_correlation_id=int(e.linked_correlation_id()),
            activity=_activity(e),
        )
        for e in prof.profiler.kineto_results.events()
    ]


def launches_from_events(events: Iterable[ProfilerEvent]) -> list[KernelLaunch]:
    """GPU kernels (and copies/sets) among the events, each with the innermost op that launched it.

    A device event's `linked_correlation_id` is the id of the CPU op on top of the stack when it
    was launched. Only named ops (`ns::name`) are taken as launchers: the profiler's own CPU
    records ("Activity Buffer Request", "cudaLaunchKernel") can share ids with them.
    """
    events = list(events)
    ops: dict[int, str] = {}
    for e in events:
        if e.device == "cpu" and e.correlation_id > 0 and "::" in e.name and e.correlation_id not in ops:
            ops[e.correlation_id] = e.name
    launches: list[KernelLaunch] = []
    for e in events:
        if e.device != "cuda" or e.name == ANNOTATION:
            continue
        activity = e.activity
        if "memcpy" in activity or (not activity and e.name.startswith("Memcpy")):
            kind = "memcpy"
        elif "memset" in activity or (not activity and e.name.startswith("Memset")):
            kind = "memset"
        elif "kernel" in activity or not activity:
            kind = "kernel"
        else:
            continue  # GPU-side annotation ranges, synchronisation records, ...
        op = ops.get(e.linked_correlation_id)
        launches.append(KernelLaunch(name=e.name, op=None if op in (None, ANNOTATION) else op, kind=kind))
    return launches


def record_launches(call: Callable[[], Any]) -> tuple[list[KernelLaunch], bool]:
    """Runs `call` once under the profiler; returns its kernel launches and whether GPU activity was visible."""
    events = profile_events(call)
    gpu_seen = any(e.device == "cuda" for e in events)
    return launches_from_events(events), gpu_seen or not torch.cuda.is_available()


def _device_type(event: Any) -> str:
    return str(event.device_type()).rsplit(".", 1)[-1].lower()


def _activity(event: Any) -> str:
    getter = getattr(event, "activity_type", None)
    try:
        return str(getter()).lower() if getter else ""
    except Exception:  # noqa: BLE001 - a torch without it
        return ""


def census(call: Callable[[], Any], allow: Collection[str] = ()) -> KernelCensus:
    """Kernel census of one call (GPU): own kernels, library kernels, PyTorch ops that launched kernels."""
    if not torch.cuda.is_available():
        return KernelCensus(available=False, note="no CUDA device: kernel census skipped")
    try:
        launches, visible = record_launches(call)
    except ProfilerForbidden:
        raise
    except Exception as exc:  # noqa: BLE001 - the profiler can be unavailable; the dispatch-mode guard still ran
        return KernelCensus(available=False, note=f"profiler unavailable: {type(exc).__name__}: {exc}")
    if not visible:
        return KernelCensus(available=False, launches=launches, note="the profiler saw no GPU activity")
    result = classify_launches(launches, allow)
    return result

