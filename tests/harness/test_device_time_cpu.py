"""Device time without a GPU: the summing function on real profiler output (CPU) and on device
events of our own `ProfilerEvent` type, the fields it fills, and where they are shown."""

from __future__ import annotations

import time

import pytest
import torch

from kb_mcp.harness.baselines import Baseline
from kb_mcp.harness.judgment.kernels import DeviceTime
from kb_mcp.harness.judgment.verdict import CompileResult, InputSetCheck, Timings, VerifyOptions, VerifyResult, decide
from kb_mcp.harness.protocol import TO_WORKER, CensusAnswer, CensusReply
from kb_mcp.harness.worker.profiling import (
    FLUSH_RANGE,
    RUN_RANGE,
    ProfilerEvent,
    device_kind,
    device_time,
    measure_device_time,
    profile_runs,
)
from kb_mcp.harness.worker.run_stats import RunStats
from kb_mcp.harness.worker.timing import timings_against
from kb_mcp.kb.models import Verdict

US = 1000  # ns


def _range(name: str, start_us: float, length_us: float) -> ProfilerEvent:
    return ProfilerEvent(name=name, device="cpu", correlation_id=0, linked_correlation_id=0,
                         activity="user_annotation", start_ns=int(start_us * US), duration_ns=int(length_us * US))


def _device(name: str, start_us: float, length_us: float, activity: str = "kernel") -> ProfilerEvent:
    return ProfilerEvent(name=name, device="cuda", correlation_id=0, linked_correlation_id=0, activity=activity,
                         start_ns=int(start_us * US), duration_ns=int(length_us * US))


def _runs(per_run: list[list[tuple[str, float, str]]]) -> list[ProfilerEvent]:
    """Kineto-like events of `profile_runs`: per run a flush range with its fill kernel, then the
    run's range with its device activities (name, duration us, activity) one after another, and the
    GPU-side copy of the run's range that kineto adds."""
    events: list[ProfilerEvent] = []
    t = 100.0
    for acts in per_run:
        events += [_range(FLUSH_RANGE, t, 60), _device("fill_kernel", t + 5, 50)]
        t += 70
        length = sum(d for _, d, _ in acts) + 20
        events.append(_range(RUN_RANGE, t, length))
        at = t + 5
        for name, dur, activity in acts:
            events.append(_device(name, at, dur, activity))
            at += dur
        events.append(_device(RUN_RANGE, t + 5, length - 10, "gpu_user_annotation"))
        t += length + 10
    return events


def test_device_time_sums_each_runs_kernels_copies_and_sets_and_takes_the_median() -> None:
    one = [("gemm", 10.0, "kernel"), ("Memcpy DtoD", 2.0, "gpu_memcpy"), ("Memset", 1.0, "gpu_memset")]
    events = _runs([one, [("gemm", 30.0, "kernel"), ("Memcpy DtoD", 2.0, "gpu_memcpy"), ("Memset", 1.0, "gpu_memset")],
                    one])
    got = device_time(events)
    # medians of 13, 33, 13 us: the flush's fill kernel and the GPU-side ranges never count
    assert got == DeviceTime(ms=0.013, kernels=3, runs=3)


def test_activity_left_out_by_an_older_torch_is_read_from_the_name() -> None:
    assert device_kind(_device("Memcpy HtoD", 0, 1, "")) == "memcpy"
    assert device_kind(_device("Memset (Device)", 0, 1, "")) == "memset"
    assert device_kind(_device("my_kernel", 0, 1, "")) == "kernel"
    assert device_kind(_device(RUN_RANGE, 0, 1, "")) is None  # kineto's GPU-side copy of our range
    assert device_kind(_device(RUN_RANGE, 0, 1, "kernel")) == "kernel"  # a kernel is a kernel, whatever its name
    assert device_kind(_range("aten::add", 0, 1)) is None


def test_activities_outside_every_run_are_not_counted() -> None:
    events = [_device("before_any_range", 0, 500), *_runs([[("k", 4.0, "kernel")]])]
    assert device_time(events).ms == 0.004


def test_real_profiler_output_on_cpu_has_runs_but_no_device_time() -> None:
    calls: list[int] = []
    x = torch.ones(64)
    events = profile_runs(lambda: calls.append(int((x + 1).sum())), lambda: None, runs=3, budget_s=10)
    assert len(calls) == 3
    assert sum(e.name == RUN_RANGE for e in events) == 3 and sum(e.name == FLUSH_RANGE for e in events) == 3
    assert all(e.duration_ns > 0 and e.start_ns > 0 for e in events)
    got = device_time(events)
    assert got.ms is None and got.runs == 3 and "no GPU kernel durations" in got.note


def test_profiled_runs_stop_when_the_budget_is_spent() -> None:
    calls: list[float] = []
    events = profile_runs(lambda: (calls.append(1.0), time.sleep(0.03)), lambda: None, runs=10, budget_s=0.05)
    assert 1 <= len(calls) <= 3
    assert sum(e.name == RUN_RANGE for e in events) == len(calls)


def test_without_cuda_device_time_is_not_measured_and_never_raises() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    got = measure_device_time(lambda: 1 / 0, lambda: None)
    assert got.ms is None and "no CUDA device" in got.note


def _stats(ms: float, n: int = 10) -> RunStats:
    return RunStats(gpu_ms=[ms] * n, host_ms=[ms + 0.01] * n, issue_ms=[ms / 4] * n)


BASE = Baseline(problem_hash="h", device="H100", torch_version="2", eager_ms=0.4, eager_runs=100)


def test_timings_carry_both_device_times_beside_the_end_to_end_ones() -> None:
    t = timings_against(_stats(0.02), None, BASE, True, want_compile=False, quick=False, bound_ms=None,
                        device=DeviceTime(ms=0.003, kernels=1, runs=10), eager_device=DeviceTime(ms=0.12, runs=10))
    assert (t.candidate_ms, t.eager_ms, t.speedup_vs_eager) == (0.02, 0.4, 20.0)
    assert (t.candidate_device_ms, t.candidate_kernels, t.eager_device_ms) == (0.003, 1, 0.12)
    assert t.speedup_device_vs_eager == 40.0
    assert "device" not in t.note


def test_eager_device_time_comes_from_the_baseline_where_the_census_did_not_measure_it() -> None:
    base = BASE.model_copy(update={"eager_device_ms": 0.1})
    t = timings_against(_stats(0.02), None, base, True, want_compile=False, quick=False, bound_ms=None,
                        device=DeviceTime(ms=0.004, kernels=1, runs=10), eager_device=None)
    assert (t.eager_device_ms, t.speedup_device_vs_eager) == (0.1, 25.0)


def test_unknown_device_times_stay_none_with_a_note() -> None:
    note = "the profiler recorded no GPU kernel durations (no CUDA device, or CUPTI unavailable): device time unknown"
    t = timings_against(_stats(0.02), None, BASE, True, want_compile=False, quick=False, bound_ms=None,
                        device=DeviceTime(runs=10, note=note), eager_device=DeviceTime(runs=10, note=note))
    assert t.candidate_device_ms is None and t.eager_device_ms is None and t.speedup_device_vs_eager is None
    assert t.candidate_kernels is None
    assert f"device time unknown: {note}" in t.note and "eager's device time unknown" in t.note
    bare = timings_against(_stats(0.02), None, BASE, True, want_compile=False, quick=False, bound_ms=None)
    assert bare.candidate_device_ms is None and bare.note == ""  # not measured at all: nothing to say


def _decided(t: Timings) -> tuple[Verdict, str]:
    sets = [InputSetCheck(index=i, kind="secret", passed=True) for i in range(6)]
    verdict, _, summary = decide(CompileResult(ok=True), sets, [], t)
    return verdict, summary


def test_the_summary_shows_device_time_and_end_to_end_time_still_decides() -> None:
    # Slower end to end (launch-bound host costs), faster on the device: the verdict is slower.
    t = Timings(candidate_ms=0.5, candidate_min_ms=0.5, candidate_host_ms=0.5, runs=10, eager_ms=0.4,
                speedup_vs_eager=0.8, speedup_vs_baseline=0.8, candidate_device_ms=0.01, candidate_kernels=1,
                eager_device_ms=0.2, speedup_device_vs_eager=20.0)
    verdict, summary = _decided(t)
    assert verdict == Verdict.slower
    assert summary.startswith("slower: 0.5 ms vs eager 0.4 ms (0.80x); device 0.01 ms vs eager 0.2 ms (20.00x); ")
    alone = t.model_copy(update={"eager_device_ms": None, "speedup_device_vs_eager": None})
    assert "(0.80x); device 0.01 ms; 6 input sets" in _decided(alone)[1]
    unknown = t.model_copy(update={"candidate_device_ms": None, "speedup_device_vs_eager": None})
    assert "device" not in _decided(unknown)[1]


def test_the_record_and_the_wire_carry_device_times() -> None:
    t = Timings(candidate_ms=0.02, candidate_min_ms=0.02, candidate_host_ms=0.03, runs=10, eager_ms=0.4,
                speedup_vs_eager=20.0, speedup_vs_baseline=20.0, candidate_device_ms=0.003, eager_device_ms=0.12,
                speedup_device_vs_eager=40.0)
    result = VerifyResult(candidate_id="c", problem="p", problem_hash="h", verdict=Verdict.faster, summary="",
                          compile=CompileResult(ok=True), timings=t, device="H100", arch="sm_90")
    record = result.record(VerifyOptions())
    assert (record.device_ms, record.eager_device_ms, record.time_ms) == (0.003, 0.12, 0.02)
    assert VerifyResult.model_validate_json(result.model_dump_json()).timings == t
    reply = CensusReply(device=DeviceTime(ms=0.003, kernels=1, runs=10), reference_device=DeviceTime(note="why"))
    back = TO_WORKER.validate_json(CensusAnswer(rid="r", reply=reply).model_dump_json())
    assert back.reply == reply
    old = Baseline.model_validate_json(BASE.model_dump_json(exclude={"eager_device_ms"}))
    assert old.eager_device_ms is None  # baselines cached before device time are still read


def test_a_call_that_launches_nothing_takes_no_device_time_where_the_device_is_seen() -> None:
    got = device_time(_runs([[], []]))  # only the flushes' kernels
    assert got == DeviceTime(ms=0.0, kernels=0, runs=2)
