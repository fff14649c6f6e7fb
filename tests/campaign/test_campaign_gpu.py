"""The campaign for real on a GPU: two example problems, 2 iterations x 2 steps, every candidate
verified and timed by the harness, profiled and classified, and the KB's scores and lessons moved
by what was measured. Run with scripts/gpu-check.sh tests/campaign/test_campaign_gpu.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from campaign_helpers import CHAIN, SWISH, campaign_command, campaign_env, run_campaign_process
from fakellm import FakeLLMServer
from fakellm.campaign_script import campaign_script

from kb_mcp.campaign.store import CampaignStore
from kb_mcp.kb.models import ALL_ARCH
from kb_mcp.kb.store import KBStore

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_campaign_on_gpu_moves_kb_scores_and_lessons(tmp_path: Path) -> None:
    kb, out = tmp_path / "kb.json", tmp_path / "camp"
    seed = KBStore.open(kb)
    with seed.read() as view:
        seed_lessons = view.stats().lessons
    with FakeLLMServer(campaign_script()) as server:
        proc = run_campaign_process(
            campaign_command(kb, out, [SWISH, CHAIN], "--iterations", "2", "--steps", "2", "--gradient-every", "2",
                             "--fix-attempts", "2", "--generate-attempts", "3"),
            campaign_env(server, tmp_path / "home"),
            timeout=540,
        )
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    store = CampaignStore(out)
    report = json.loads((store.report_dir / "report.json").read_text())
    print(json.dumps({k: report[k] for k in ("valid_rate", "speedup", "fast_p", "gradient")}, indent=1))
    for p in report["problems"]:
        print(p["problem"], p["eager_ms"], p["compile_ms"], p["initial_ms"], p["best_ms"], p["best_speedup"])

    assert report["mode"] == "gpu" and report["valid_rate"] == 1.0
    assert all(p["best_speedup"] is not None and p["best_ms"] <= p["initial_ms"] for p in report["problems"])
    steps = store.steps()
    assert len(steps) == 8 and all(s.state_source == "classified" for s in steps if s.state_id)

    fresh = KBStore.open(kb)
    measured = [s for s in steps if s.outcome_recorded and s.verdict is not None and s.verdict.is_valid]
    assert measured, "no step produced a timed outcome"
    for s in measured:
        score = fresh.get_score(s.state_id, s.optimization_id, ALL_ARCH)
        assert score is not None and score.samples >= 1 and not score.prior
        # the score's mean moved to the measured speedups of its outcomes
        assert math.isfinite(score.mean_log_speedup) and score.mean_log_speedup != 0.0
    gradients = store.gradients()
    assert gradients and all(not g.error for g in gradients)
    assert fresh.stats().lessons > seed_lessons
    lessons = [lesson for g in gradients for e in g.applied if e["kind"] == "add_lesson"
               for lesson in fresh.lessons(e["state_id"], e["optimization_id"]) if lesson.source == "textual_gradient"]
    assert lessons
    best = (store.root / "best" / "swish.py").read_text()
    assert "UNVERIFIED" not in best and "class ModelNew" in best
