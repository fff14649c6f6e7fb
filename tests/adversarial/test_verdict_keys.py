"""Hostile callers against stored verdicts: re-verifying a candidate with weaker, stricter or
loosened options must neither replace its verdict nor reach a score, and limits beyond the
server's caps are refused. Driven through a real MCP client over stdio, as an agent would."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from kb_mcp.clients.mcp_client import ToolCallError, call_json, stdio_params
from kb_mcp.kb.models import Strength, Verdict
from kb_mcp.kb.store import KBStore

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples" / "problems" / "swish.py"
CANDIDATE = ROOT / "examples" / "candidates" / "swish_nvrtc.py"
STATE = "high_level_inefficiency"


@pytest.mark.nvcc
async def test_weaker_reverification_changes_neither_the_stored_verdict_nor_the_score(kb_path: Path) -> None:
    # compile-only on every machine: the verdicts here are the CPU path's, with real nvcc builds
    async with Client(stdio_params(kb_path, env={"CUDA_VISIBLE_DEVICES": ""})) as client:
        base = {"problem": str(PROBLEM), "candidate": str(CANDIDATE)}
        first = await call_json(client, "compile_and_verify", base)
        record = first["record"]
        assert record["verdict"] == "needs_gpu" and record["strength"] == "compile_only" and first["standing"] is None
        cid = record["candidate_id"]

        # the same source again: a bogus target arch (nvcc refuses it), and a limit no cold build could meet
        for options, verdict in (({"arch": "sm_10"}, "compile_error"), ({"compile_timeout_s": 0.01}, None)):
            weak = await call_json(client, "compile_and_verify", {**base, "options": options})
            assert weak["record"]["candidate_id"] == cid and weak["record"]["strength"] == "custom"
            assert verdict is None or weak["record"]["verdict"] == verdict, weak  # it failed, under its own key
            assert weak["record"]["options_digest"] != record["options_digest"]
            assert weak["standing"] == record, "the stronger stored verdict stands and is shown"
        opt = (await call_json(client, "suggest_optimizations", {"state_id": STATE, "k": 1}))["suggestions"][0]["id"]
        recorded = await call_json(client, "record_outcome", {"state_id": STATE, "optimization_id": opt,
                                                              "candidate_id": cid})
        assert recorded["verdict"] == "needs_gpu" and recorded["score_moved"] is False

    with KBStore.open(kb_path).read() as view:
        verdicts = view.candidate_verdicts(cid)
        score = view.get_score(STATE, opt)
    assert [v.strength for v in verdicts] == [Strength.compile_only, Strength.custom, Strength.custom]
    assert verdicts[0].verdict == Verdict.needs_gpu and len({v.key for v in verdicts}) == 3
    assert score is not None and score.compile_failures == 0 and score.verify_failures == 0 and score.attempts == 0


@pytest.mark.nvcc
async def test_a_loosened_verdict_is_flagged_and_never_credited(kb_path: Path) -> None:
    source = CANDIDATE.read_text() + "\n# loosened\n"
    async with Client(stdio_params(kb_path, env={"CUDA_VISIBLE_DEVICES": ""})) as client:
        loose = await call_json(client, "compile_and_verify", {
            "problem": str(PROBLEM), "candidate": source, "options": {"allow": ["gemm"], "implausible_speedup": 1000},
        })
        record = loose["record"]
        assert record["flagged"] and record["strength"] == "loosened" and len(record["loosened"]) == 2
        assert "loosened" in loose["summary"] and "never credited" in loose["next_step"]
        opt = (await call_json(client, "suggest_optimizations", {"state_id": STATE, "k": 1}))["suggestions"][0]["id"]
        with pytest.raises(ToolCallError,
                           match=r"cannot move a score because it was checked with loosened options.*default options"):
            await call_json(client, "record_outcome",
                            {"state_id": STATE, "optimization_id": opt, "candidate_id": record["candidate_id"]})
        with pytest.raises(ToolCallError, match=r"timeout_s=3600 is above this server's cap of 600"):
            await call_json(client, "compile_and_verify",
                            {"problem": str(PROBLEM), "candidate": source, "options": {"timeout_s": 3600}})
    with KBStore.open(kb_path).read() as view:
        assert view.outcomes() == []  # nothing recorded for the loosened verdict


@pytest.mark.gpu
def test_on_the_gpu_a_reverification_with_a_tiny_limit_does_not_replace_a_faster_verdict(tmp_path: Path) -> None:
    from kb_mcp.tools import compile_and_verify, record_outcome, suggest_optimizations
    from kb_mcp.tools.context import ToolContext

    ctx = ToolContext(tmp_path / "kb.json", cache_dir=tmp_path / "cache")
    try:
        request = compile_and_verify.Request(problem=str(PROBLEM), candidate=str(CANDIDATE))
        strong = compile_and_verify.run(ctx, request)
        assert strong.record.strength == Strength.standard and strong.record.verdict.is_valid, strong.summary
        weak = compile_and_verify.run(ctx, request.model_copy(update={"options": request.options.model_copy(
            update={"timeout_s": 0.001})}))
        assert weak.record.strength == Strength.custom and weak.standing == strong.record
        assert ctx.store.get_candidate(strong.record.candidate_id) == strong.record
        opt = suggest_optimizations.run(ctx, suggest_optimizations.Request(state_id=STATE, k=1)).suggestions[0].id
        recorded = record_outcome.run(ctx, record_outcome.Request(
            state_id=STATE, optimization_id=opt, candidate_id=strong.record.candidate_id))
        assert recorded.verdict == strong.record.verdict and recorded.score_moved
    finally:
        ctx.close()
