"""Composed mode through the tools: the request's `mode`, the stored verdict (standard, with its mode and
coverage, under a key of its own) and `record_outcome`, which credits it and keeps its mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kb_mcp.harness.judgment.options import assess_options
from kb_mcp.harness.judgment.verdict import CompileResult, InputSetCheck, Timings, VerifyOptions, VerifyResult, decide
from kb_mcp.kb.models import CandidateRecord, Strength, Verdict
from kb_mcp.tools import compile_and_verify as cv
from kb_mcp.tools import record_outcome as ro
from kb_mcp.tools.compile_and_verify import summarize
from kb_mcp.tools.context import ToolContext


def test_the_requests_mode_travels_with_the_options() -> None:
    req = cv.Request.model_validate({"problem": "p.py", "candidate": "c.py", "mode": "composed"})
    assert req.mode == "composed" and req.options.mode == "composed"
    via_options = cv.Request.model_validate({"problem": "p.py", "candidate": "c.py", "options": {"mode": "composed"}})
    assert via_options.mode == "composed"
    assert cv.Request.model_validate({"problem": "p.py", "candidate": "c.py"}).options.mode == "own"
    with pytest.raises(ValueError):
        cv.Request.model_validate({"problem": "p.py", "candidate": "c.py", "mode": "anything"})


def test_composed_is_a_standard_strength_under_a_key_of_its_own() -> None:
    composed = assess_options(VerifyOptions(mode="composed"), gpu=True)
    assert composed.strength == Strength.standard and composed.options == {"mode": "composed"}
    assert assess_options(VerifyOptions(), gpu=True).options == {}


def _result(coverage: float | None) -> VerifyResult:
    sets = [InputSetCheck(index=i, kind="secret", passed=True) for i in range(6)]
    timings = Timings(candidate_ms=1.0, candidate_min_ms=0.9, candidate_host_ms=1.1, runs=100, eager_ms=2.0,
                      speedup_vs_eager=2.0, speedup_vs_baseline=2.0)
    verdict, flagged, summary = decide(CompileResult(ok=True), sets, [], timings)
    return VerifyResult(candidate_id="c_model", problem="block", problem_hash="h1", verdict=verdict, summary=summary,
                        flagged=flagged, compile=CompileResult(ok=True), input_sets=sets, timings=timings,
                        device="NVIDIA H200", arch="sm_90", mode="composed", coverage=coverage)


def test_a_composed_record_keeps_mode_and_coverage_and_counts() -> None:
    result = _result(0.42)
    record = result.record(VerifyOptions(mode="composed"))
    assert (record.mode, record.coverage, record.strength) == ("composed", 0.42, Strength.standard)
    assert record.creditable
    own = result.record(VerifyOptions())
    assert own.options_digest != record.options_digest  # two readings, two keys
    out = summarize(result, record, None, "/tmp/c_model.py", detail=False)
    assert out.model_dump(mode="json")["record"]["coverage"] == 0.42


def test_records_written_before_modes_read_as_own() -> None:
    old = {"candidate_id": "c", "problem": "p", "problem_hash": "h", "verdict": "faster", "device": "NVIDIA H100"}
    record = CandidateRecord.model_validate_json(json.dumps(old))
    assert record.mode == "own" and record.coverage is None and record.creditable


def test_record_outcome_credits_a_composed_verdict_and_keeps_its_mode(kb_path: Path) -> None:
    ctx = ToolContext(kb_path, client_name="test-agent")
    record = _result(0.42).record(VerifyOptions(mode="composed"))
    with ctx.store.transaction() as tx:
        tx.put_candidate(record)
    res = ro.run(ctx, ro.Request.model_validate({"state_id": "memory_bandwidth_saturated",
                                                  "optimization_id": "fuse_elementwise_chain",
                                                  "candidate_id": "c_model"}))
    assert res.recorded and res.score_moved
    outcome = ctx.store.get_outcome(res.outcome_id)
    assert outcome is not None and outcome.mode == "composed" and outcome.verdict == Verdict.faster
