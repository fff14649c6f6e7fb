"""A campaign on a model on CPU: the scripted LLM, a real KB, the real sandbox and nvcc. The model (a
swish chain, then a small GEMM) is decomposed; its largest part is optimized by a campaign of its own
(recorded as a problem of its own); Amdahl then stops the run (the rest cannot reach the target); the
whole-model candidate is composed from the part's kernel and verified end to end in composed mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakellm import FakeLLMServer
from fakellm.campaign_script import analyze, evaluate, kernel, review, update
from fakellm.server import Answer, Rule, Script

from kb_mcp.campaign.model_campaign import MODEL_RECORD, amdahl, bound_now, run_model_campaign
from kb_mcp.campaign.runner import CampaignOptions
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.clients.llm import LLMConfig

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d, k):
        super().__init__()
        self.head = nn.Linear(d, k)

    def forward(self, x):
        return self.head(x * torch.sigmoid(x))


def get_inputs():
    return [torch.randn(2048, 2048)]


def get_init_inputs():
    return [2048, 8]
'''


def script() -> Script:
    """The swish part gets the scripted swish kernels; every other role answers as in the campaign script."""
    return Script(rules=[
        Rule(role="generate", problem="part01", answers=[Answer(text=kernel("swish_v1"))]),
        Rule(role="lower", problem="part01", cycle=True, answers=[Answer(text=kernel("swish_b512"))]),
        Rule(role="review", responder=review),
        Rule(role="evaluate", responder=evaluate),
        Rule(role="analyze", responder=analyze),
        Rule(role="update", responder=update),
    ])


def test_amdahl_bounds_the_model() -> None:
    assert amdahl([0.5, 0.5], [1.0, 1.0]) == 1.0
    assert abs(amdahl([0.75, 0.25], [1.0, 4.0]) - 1 / (0.75 + 0.0625)) < 1e-12
    assert bound_now([0.75, 0.25], [], 4.0) == 4.0


def test_a_model_campaign_decomposes_optimizes_by_share_and_composes(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_MCP_HOME", str(tmp_path / "home"))
    model = tmp_path / "swish_head.py"
    model.write_text(MODEL)
    options = CampaignOptions(iterations=1, steps=1, compile_only=True, fix_attempts=1, generate_attempts=1,
                              gradient_every=0, review=False)
    with FakeLLMServer(script()) as server:
        llm = LLMConfig(base_url=server.base_url, api_key="test-key", model="fake-model", max_retries=2)
        record = run_model_campaign(tmp_path / "camp", tmp_path / "kb.json", model, options, llm, target=1.6,
                                    part_cap=4.0, log=lambda _line: None)
        asked = {r.problem for r in server.requests}
    # the swish chain is the largest part; after it (unmeasured on CPU), the GEMM alone cannot reach 1.6x
    assert [p.part for p in record.parts] == ["part01"] and asked == {"part01"}
    assert record.parts[0].share > 0.5 and "cannot reach 1.6x" in record.stopped and record.bound < 1.6
    part_campaign = CampaignStore(Path(record.parts[0].folder))
    assert part_campaign.read_status().state == "finished"
    assert part_campaign.initials()["part01"].final.verdict.value == "needs_gpu"  # a problem of its own
    composed = Path(record.composed_file or "").read_text()
    assert "swish_kernel" in composed and "class ModelNew" in composed and "the reference part" in composed
    assert record.verdict == "needs_gpu" and record.candidate_id  # compiled end to end; timing needs a GPU
    saved = json.loads((tmp_path / "camp" / MODEL_RECORD).read_text())
    assert saved["candidate_id"] == record.candidate_id and saved["parts"][0]["part"] == "part01"
