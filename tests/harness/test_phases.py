"""The phases' words and the per-phase clock of a verification (`harness.phases`)."""

from __future__ import annotations

import re

import pytest

from kb_mcp.harness.phases import BASELINE_WORDS, PHASE_WORDS, PHASES, PhaseClock, StepClock


def test_every_phase_has_words() -> None:
    assert set(PHASES) <= set(PHASE_WORDS) and "queued" in PHASE_WORDS


def test_the_clock_adds_each_phase_up_to_the_whole() -> None:
    clock = PhaseClock(100.0)
    for phase, now in [("static", 100.5), ("import", 101.0), ("check", 103.0), ("census", 104.0),
                       ("check", 104.25), ("timing", 106.0)]:
        clock.enter(phase, now)
    got = clock.seconds(110.0)
    assert got == {"queued": 0.5, "static": 0.5, "import": 2.0, "check": 2.75, "census": 0.25, "timing": 4.0}
    assert list(got) == ["queued", "static", "import", "check", "census", "timing"]  # order first entered
    assert sum(got.values()) == pytest.approx(10.0)


def test_a_request_without_phase_frames_is_all_queued() -> None:
    assert PhaseClock(5.0).seconds(7.5) == {"queued": 2.5}


class _Clock:
    """Readings a test sets by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_step_clock_puts_a_workers_steps_in_the_place_of_its_request() -> None:
    clock = _Clock()
    steps = StepClock(clock)
    for step, now in [("lane", 2.0), ("worker_start", 2.5), ("request", 12.5), ("worker_restart", 20.0)]:
        clock.now = now
        steps.mark(step)
    assert steps.seconds == {"lane": 2.0, "worker_start": 0.5, "request": 10.0, "worker_restart": 7.5}
    got = steps.nested("request", {"load": 1.0, "eager": 3.0, "compile": 5.5})
    assert list(got) == ["lane", "worker_start", "load", "eager", "compile", "request_rest", "worker_restart"]
    assert got["request_rest"] == 0.5 and sum(got.values()) == pytest.approx(20.0)
    assert steps.nested("request", {}) == steps.seconds  # a worker that said nothing: the request whole


def test_a_step_marked_twice_adds_up_and_a_worker_claiming_more_leaves_no_negative_rest() -> None:
    clock = _Clock()
    steps = StepClock(clock)
    clock.now = 1.0
    steps.mark("a")
    clock.now = 3.0
    steps.mark("b")
    clock.now = 4.5
    steps.mark("a")
    assert steps.seconds == {"a": 2.5, "b": 2.0}
    assert steps.nested("b", {"x": 2.5}) == {"a": 2.5, "x": 2.5}


def test_every_baseline_phase_the_worker_reports_has_words() -> None:
    import inspect

    from kb_mcp.harness.worker import baseline_run

    reported = set(re.findall(r'report\("(\w+)"\)', inspect.getsource(baseline_run)))
    assert reported and reported <= set(BASELINE_WORDS), reported
