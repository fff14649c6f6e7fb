"""The phases' words and the per-phase clock of a verification (`harness.phases`)."""

from __future__ import annotations

import pytest

from kb_mcp.harness.phases import PHASE_WORDS, PHASES, PhaseClock


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
