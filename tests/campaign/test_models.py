"""The campaign's plain records: the report's line on what the cluster re-ran."""

from __future__ import annotations

from kb_mcp.campaign.models import Retry, retried_text


def test_the_report_line_names_what_was_retried() -> None:
    assert retried_text([]) == ""
    text = retried_text([Retry(problem="b", candidate_id="x", deaths=1), Retry(problem="a", candidate_id="y",
                                                                               deaths=2)])
    assert text.startswith("2 verification(s) re-run") and text.endswith(": a, b")


def test_the_report_line_names_workers_withdrawn_and_tasks_asked_again() -> None:
    text = retried_text([Retry(problem="b", candidate_id="x", deaths=1),
                         Retry(problem="a", candidate_id="y", deaths=0, withdrawn=["gpu-1"]),
                         Retry(problem="c", candidate_id="z", deaths=0, again=1)])
    assert "1 verification(s) re-run on another worker after theirs died: b" in text
    assert "1 re-run on another worker after theirs could not run the harness and was withdrawn (gpu-1): a" in text
    assert text.endswith("1 asked again after their worker's harness process was lost: c")
