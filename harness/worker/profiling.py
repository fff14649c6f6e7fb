"""The census worker's profiler sessions (worker side): the kernel census (one call under the PyTorch
profiler, its GPU kernels each with the ATen op that launched it) and the device time (`DeviceTime`:
a few more calls, the durations of the kernels each launched summed per call). Only the census
worker starts a session; a process that times candidates calls `forbid_profiler()`."""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from kb_mcp.harness.judgment.kernels import DeviceTime, KernelCensus, KernelLaunch, classify_launches

ANNOTATION = "kbmcp::candidate_forward"
# The device time's runs: each call inside RUN_RANGE, the L2 flush before it inside FLUSH_RANGE.
RUN_RANGE = "kbmcp::device_run"
FLUSH_RANGE = "kbmcp::l2_flush"
_RANGES = frozenset({ANNOTATION, RUN_RANGE, FLUSH_RANGE})
DEVICE_RUNS = 10  # profiled calls per device time (fewer when DEVICE_BUDGET_S runs out first)
DEVICE_BUDGET_S = 0.4  # host time the profiled calls of one device time may take (the candidate's, the reference's)
_clock = time.perf_counter  # captured before any candidate is imported

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
    start_ns: int = 0  # on the profiler's clock (device activities are converted to the host's)
    duration_ns: int = 0


def _session() -> Any:
    """A new profiler session (CPU, and CUDA where present), counted; refused in a timing process."""
    from torch.profiler import ProfilerActivity, profile

    if _PROFILER_STATE["forbidden"]:
        raise ProfilerForbidden(
            "this process times candidates and must stay free of profiler sessions; the kernel census "
            "runs in the census worker (harness.census)"
        )
    _PROFILER_STATE["sessions"] += 1
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return profile(activities=activities)


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _events(prof: Any, keep: Callable[[Any], bool] = lambda e: True) -> list[ProfilerEvent]:
    return [
        ProfilerEvent(
            name=e.name(),
            device=_device_type(e),
            correlation_id=int(e.correlation_id()),
            linked_correlation_id=int(e.linked_correlation_id()),
            activity=_activity(e),
            start_ns=int(e.start_ns()),
            duration_ns=int(e.duration_ns()),
        )
        for e in prof.profiler.kineto_results.events() if keep(e)
    ]


def profile_events(call: Callable[[], Any]) -> list[ProfilerEvent]:
    """Runs `call` once under the profiler (inside the `ANNOTATION` range) and returns its raw events."""
    from torch.profiler import record_function

    with _session() as prof:
        with record_function(ANNOTATION):
            call()
        _synchronize()
    return _events(prof)


def device_kind(event: ProfilerEvent) -> str | None:
    """What a profiler event is on the device: "kernel", "memcpy" or "memset"; None for anything
    else (host events, GPU-side annotation ranges, synchronisation records)."""
    if event.device != "cuda":
        return None
    activity, name = event.activity, event.name
    if "memcpy" in activity or (not activity and name.startswith("Memcpy")):
        return "memcpy"
    if "memset" in activity or (not activity and name.startswith("Memset")):
        return "memset"
    if "kernel" in activity or (not activity and name not in _RANGES):
        return "kernel"
    return None


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
        kind = device_kind(e)
        if kind is None or e.name == ANNOTATION:
            continue
        op = ops.get(e.linked_correlation_id)
        launches.append(KernelLaunch(name=e.name, op=None if op in (None, ANNOTATION) else op, kind=kind,
                                     ns=max(0, e.duration_ns)))
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
        events = profile_events(call)
        launches = launches_from_events(events)
        visible = any(e.device == "cuda" for e in events)
    except ProfilerForbidden:
        raise
    except Exception as exc:  # noqa: BLE001 - the profiler can be unavailable; the dispatch-mode guard still ran
        return KernelCensus(available=False, note=f"profiler unavailable: {type(exc).__name__}: {exc}")
    if not visible:
        return KernelCensus(available=False, launches=launches, note="the profiler saw no GPU activity")
    return classify_launches(launches, allow, graph_launches=graph_launches(events))


def graph_launches(events: Iterable[ProfilerEvent]) -> int:
    """How many CUDA graphs the host launched among `events` (the runtime's or driver's graph launch calls)."""
    return sum(1 for e in events if e.device == "cpu" and e.name.startswith(("cudaGraphLaunch", "cuGraphLaunch")))



# ---------------------------------------------------------------------------------------------
# Device time


def device_time(events: Sequence[ProfilerEvent]) -> DeviceTime:
    """The device time of the runs among `events` (`profile_runs`): per run, the summed durations of
    the kernels, copies and sets that started inside its `RUN_RANGE`; the median over the runs.

    Each device activity belongs to the last range (`RUN_RANGE` or `FLUSH_RANGE`) that began before
    it started: it was launched inside that range (a launch comes after its range began) and ran
    before the next one began (every range ends with a device-wide synchronize), so the L2 flush's
    kernel is never counted as the call's. No device activity at all (not even the flush's): ms
    None, with a note; a call that launched nothing on a device the profiler sees: 0.
    """
    ranges = sorted((e.start_ns, e.name == RUN_RANGE) for e in events
                    if e.device == "cpu" and e.name in (RUN_RANGE, FLUSH_RANGE))
    starts = [start for start, _ in ranges]
    runs = {i: [0, 0] for i, (_, is_run) in enumerate(ranges) if is_run}
    if not runs:
        return DeviceTime(note="no profiled run to measure device time in")
    seen = False  # any device activity at all (the flush's included): the profiler sees the device
    for e in events:
        if device_kind(e) is None:
            continue
        seen = True
        i = bisect.bisect_right(starts, e.start_ns) - 1
        if i in runs:
            runs[i][0] += e.duration_ns
            runs[i][1] += 1
    if not seen:
        return DeviceTime(runs=len(runs), note="the profiler recorded no GPU kernel durations (no CUDA device, or "
                                               "CUPTI unavailable): device time unknown")
    return DeviceTime(ms=round(statistics.median(ns for ns, _ in runs.values()) / 1e6, 6),
                      kernels=max(n for _, n in runs.values()), runs=len(runs))


def profile_runs(call: Callable[[], Any], flush: Callable[[], Any], runs: int = DEVICE_RUNS,
                 budget_s: float = DEVICE_BUDGET_S) -> list[ProfilerEvent]:
    """Runs `call` `runs` times in one profiler session, each inside `RUN_RANGE` after `flush()`
    (the L2 flush) inside `FLUSH_RANGE`, each range ended by a device-wide synchronize; stops
    after the run that used up `budget_s` of host time. Returns the ranges and the device events."""
    from torch.profiler import record_function

    with _session() as prof:
        t0 = _clock()
        for _ in range(runs):
            with record_function(FLUSH_RANGE):
                flush()
                _synchronize()
            with record_function(RUN_RANGE):
                call()
                _synchronize()
            if _clock() - t0 > budget_s:
                break
    return _events(prof, lambda e: e.name() in (RUN_RANGE, FLUSH_RANGE) or _device_type(e) == "cuda")


def measure_device_time(call: Callable[[], Any], flush: Callable[[], Any], runs: int = DEVICE_RUNS,
                        budget_s: float = DEVICE_BUDGET_S) -> DeviceTime:
    """The device time of `call` (`profile_runs`, then `device_time`): the census worker's
    measurement and the bare process's in `bench/timing_fidelity.py`. Never raises for a profiler
    that cannot see the device (the note says why); raises what `call` raises."""
    if not torch.cuda.is_available():
        return DeviceTime(note="no CUDA device: device time not measured")
    raised: list[BaseException] = []

    def guarded() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)
            raise

    try:
        events = profile_runs(guarded, flush, runs, budget_s)
    except ProfilerForbidden:
        raise
    except BaseException as exc:
        if raised:
            raise
        return DeviceTime(note=f"profiler unavailable: {type(exc).__name__}: {str(exc)[:200]}")
    return device_time(events)
