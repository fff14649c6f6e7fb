"""The eval's ETA (`campaign/eta.py`): unknown until a problem finished, the first problem's time
said as such, then the mean of the later ones (the first pays the cold start)."""

from __future__ import annotations

import pytest

from kb_mcp.campaign.eta import Eta, duration


@pytest.mark.parametrize(("seconds", "text"), [(0, "0 s"), (42.4, "42 s"), (59.6, "1 min 00 s"), (185, "3 min 05 s"),
                                               (7620, "2 h 07 min"), (-3, "0 s")])
def test_durations_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_the_eta_is_unknown_until_a_problem_finished() -> None:
    eta = Eta(10)
    assert eta.remaining() is None and eta.per_problem() is None
    assert eta.text() == "ETA unknown (no problem finished yet)"
    assert eta.text(running_for=300) == "ETA unknown (no problem finished yet)"


def test_the_first_problem_alone_gives_a_rough_estimate_said_as_such() -> None:
    eta = Eta(10)
    eta.finished(60)  # its cold build could not hide behind anything
    assert eta.remaining() == 9 * 60
    assert eta.text() == "ETA about 9 min 00 s (from the first problem, cold start included)"


def test_later_problems_set_the_pace_and_the_running_one_counts() -> None:
    eta = Eta(6)
    for seconds in (60, 20, 22, 24):  # the first (cold) is left out
        eta.finished(seconds)
    assert eta.per_problem() == 22
    assert eta.left == 2
    assert eta.remaining() == 2 * 22
    assert eta.remaining(running_for=10) == 22 + 12
    assert eta.remaining(running_for=50) == 22  # running longer than usual: counted as nearly done
    assert eta.text(running_for=10) == "ETA 34 s"
    eta.finished(20)
    eta.finished(25)
    assert eta.left == 0 and eta.remaining() == 0 and eta.text() == "done"


def test_nothing_to_verify_is_done_at_once() -> None:
    assert Eta(0).text() == "done"


def test_where_builds_set_the_pace_the_estimate_is_their_pace() -> None:
    """Two builds at a time, each slower than a verification: every other problem finds its build
    made (a second), the next waits a whole build (30 s); the pace is their mean, not either."""
    eta = Eta(11)
    for seconds in (55, 1, 30, 1, 30):
        eta.finished(seconds)
    assert eta.per_problem() == 15.5 and eta.remaining() == 6 * 15.5
