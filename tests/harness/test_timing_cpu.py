"""What keeps the timing process clean, on CPU: the guard census that must be empty before a timed
series, the garbage collector paused around it, and the profiler refused in timing workers."""

from __future__ import annotations

import gc
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kb_mcp.harness.worker import integrity_runtime as rt
from kb_mcp.harness.worker import profiling
from kb_mcp.harness.worker.timing import guards_active, paused_gc


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_a_clean_process_has_no_guards_and_each_kind_is_named() -> None:
    assert guards_active() == []
    with _Passthrough():
        assert guards_active() == ["1 dispatch mode(s)"]
    with torch.device("cpu"):  # a function mode
        assert guards_active() == ["1 function mode(s)"]
    previous = sys.gettrace()
    sys.settrace(lambda *a: None)
    try:
        assert "a trace function (sys.settrace)" in guards_active()
    finally:
        sys.settrace(previous)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert "the autograd profiler" in guards_active()
    assert guards_active() == []


def test_the_collector_is_paused_only_inside_and_restored_after() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()


def test_a_timing_process_refuses_profiler_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    before = rt.profiler_sessions()
    rt.profile_events(lambda: torch.ones(4).sum())
    assert rt.profiler_sessions() == before + 1
    monkeypatch.setitem(profiling._PROFILER_STATE, "forbidden", True)
    with pytest.raises(rt.ProfilerForbidden, match="census worker"):
        rt.profile_events(lambda: torch.ones(4).sum())
    assert rt.profiler_sessions() == before + 1
