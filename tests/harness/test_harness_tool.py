"""The compile_and_verify tool function: stores the candidate and the server's verdict in the KB."""

from __future__ import annotations

import json

import pytest
from harness_helpers import FIXTURES, fixture_source

from kb_mcp.harness.worker import WorkerPool
from kb_mcp.kb.models import Verdict
from kb_mcp.tools import compile_and_verify as tool
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext


@pytest.fixture
def ctx(tmp_path):
    c = ToolContext(tmp_path / "kb.json", cache_dir=tmp_path / "cache")
    c.__dict__["workers"] = WorkerPool(c.cache_dir, no_cuda=True)  # compile-only on any machine
    yield c
    c.close()


@pytest.mark.nvcc
def test_verdict_is_stored_with_the_source_and_the_result_stays_small(ctx) -> None:
    req = tool.Request(problem=str(FIXTURES / "relu_problem.py"), candidate=fixture_source("relu_nvrtc.py"))
    res = tool.run(ctx, req)
    assert res.verdict == Verdict.needs_gpu and res.compile.ok and res.compile.kernels == ["relu_k"]
    assert res.input_sets is None and res.compile_detail is None and res.output == ""
    record = ctx.store.get_candidate(res.candidate_id)
    assert record is not None and record.verdict == Verdict.needs_gpu and record.problem == "relu_problem"
    saved = ctx.candidates_dir / f"{res.candidate_id}.py"
    assert res.candidate_path == str(saved) and saved.read_text() == fixture_source("relu_nvrtc.py")
    full = json.loads((ctx.candidates_dir / f"{res.candidate_id}.json").read_text())
    assert full["verdict"] == "needs_gpu" and full["compile"]["units"][0]["name"] == "relu_k"
    assert len(res.model_dump_json()) < 3000


@pytest.mark.nvcc
def test_detail_and_compile_errors(ctx) -> None:
    req = tool.Request(problem=str(FIXTURES / "relu_problem.py"), candidate=str(FIXTURES / "relu_nvrtc_cuda_error.py"),
                       detail=True)
    res = tool.run(ctx, req)
    assert res.verdict == Verdict.compile_error and res.compile_detail is not None
    assert "undeclared_value" in res.compile_detail.units[0].log and "fix the compiler errors" in res.next_step
    assert ctx.store.get_candidate(res.candidate_id).verdict == Verdict.compile_error


def test_a_malformed_problem_is_an_error_the_agent_can_act_on(ctx) -> None:
    with pytest.raises(ToolError, match="missing top-level get_init_inputs"):
        tool.run(ctx, tool.Request(problem="import torch\nclass Model: pass\ndef get_inputs(): return []\n",
                                   candidate=fixture_source("relu_nvrtc.py")))
    with pytest.raises(ToolError, match="not found"):
        tool.run(ctx, tool.Request(problem="/nonexistent/problem.py", candidate="class ModelNew: pass"))
