"""The GPU lane as the tools hold it: one holder at a time across threads (and contexts) of a
process, waiting reported as progress (and cancellable there), re-entrant within a thread, each hold
logged with timestamps. Across processes: tests/harness/test_machine_lane.py."""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
import time

import pytest

from kb_mcp.tools.lane import GpuLane


def test_holders_in_threads_never_overlap() -> None:
    lane = GpuLane()
    spans: list[tuple[float, float]] = []
    inside = 0
    most_inside = 0
    guard = threading.Lock()

    def work(name: str) -> None:
        nonlocal inside, most_inside
        for _ in range(5):
            with lane.hold(name):
                with guard:
                    inside += 1
                    most_inside = max(most_inside, inside)
                start = time.monotonic()
                time.sleep(0.01)
                spans.append((start, time.monotonic()))
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most_inside == 1 and len(spans) == 20
    spans.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))


def test_a_waiting_caller_hears_who_holds_it_and_can_stop_waiting() -> None:
    lane = GpuLane()
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lane.hold("profile_kernel"):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    messages: list[str] = []

    class Stop(Exception):
        pass

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        messages.append(message or "")
        raise Stop  # a cancelled call: its progress report raises

    with pytest.raises(Stop):
        with lane.hold("compile_and_verify", progress):
            pytest.fail("entered a held lane")
    release.set()
    t.join()
    assert len(messages) == 1
    assert re.fullmatch(r"waiting for the GPU(?: \S+)?: profile_kernel is running in this process "
                        rf"\(pid {os.getpid()}, since \d\d:\d\d:\d\d UTC\) \[place 2 in line: 1 ahead\]",
                        messages[0]), messages
    with lane.hold("compile_and_verify"):  # the stopped waiter left nothing held
        assert lane.holder == "compile_and_verify"
    assert lane.holder == ""


def test_reentrant_within_a_thread() -> None:
    lane = GpuLane()
    with lane.hold("outer") as outer:
        with lane.hold("inner") as inner:
            assert lane.holder == "outer" and inner is outer
        assert lane.holder == "outer"
    assert lane.holder == ""


def test_two_contexts_of_a_process_hold_one_lane() -> None:
    """Two ToolContexts of one process (two KBs, say) still share one GPU: one lane."""
    first, second = GpuLane(), GpuLane()
    with first.hold("compile_and_verify"):
        assert second.holder == "compile_and_verify"
        with second.hold("profile_kernel"):  # the same thread: re-entrant, not a second holder
            assert first.holder == "compile_and_verify"


def test_each_hold_is_logged_with_its_wait_and_time(caplog: pytest.LogCaptureFixture) -> None:
    lane = GpuLane()
    with caplog.at_level(logging.INFO, logger="kb_mcp.harness.gpu.lane"):
        with lane.hold("compile_and_verify"):
            pass
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    stamp = rf"pid={os.getpid()} place=0 ticket=-?\d+ t=[\d.]+ wall=\S+ thread=.+"
    assert re.fullmatch(rf"gpu lane: compile_and_verify entered after waiting [\d.]+ s \[gpu=\S+ scope=\w+ {stamp}\]",
                        lines[0]), lines
    assert re.fullmatch(rf"gpu lane: compile_and_verify left after [\d.]+ s \[gpu=\S+ scope=\w+ {stamp}\]", lines[1])
