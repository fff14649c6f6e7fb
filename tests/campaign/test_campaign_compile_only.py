"""A whole small campaign on CPU: `kb-mcp run-campaign --compile-only` as a real process, the real
`openai` client talking to the scripted server over loopback, candidates compiled by real nvcc,
outcomes recorded in a real KB file, and the textual gradient editing it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from campaign_helpers import CHAIN, SWISH, campaign_command, campaign_env, run_campaign_process
from fakellm import FakeLLMServer, RecordedRequest
from fakellm.campaign_script import campaign_script

from kb_mcp.campaign.report_render import PLOTS
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.kb.store import KBStore

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]


@pytest.fixture(scope="module")
def campaign(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path, CampaignStore, list[RecordedRequest]]:
    """One campaign for the whole module: the process, the KB path, the folder, the requests served."""

    tmp = tmp_path_factory.mktemp("campaign")
    kb, out = tmp / "kb.json", tmp / "camp"
    with FakeLLMServer(campaign_script()) as server:
        proc = run_campaign_process(
            campaign_command(kb, out, [SWISH, CHAIN], "--compile-only", "--iterations", "2", "--steps", "2",
                             "--gradient-every", "3", "--fix-attempts", "2", "--generate-attempts", "3"),
            campaign_env(server, tmp / "home"),
        )
        requests = server.requests
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, kb, CampaignStore(out), requests


def test_campaign_finishes_and_reports(campaign) -> None:
    proc, _kb, store, requests = campaign
    status = store.read_status()
    assert status.state == "finished" and status.runs == 1
    assert "compile-only" in proc.stdout
    report = json.loads((store.report_dir / "report.json").read_text())
    assert report["mode"] == "compile-only"
    assert [p["problem"] for p in report["problems"]] == ["swish", "elementwise_chain_small"]
    assert all(p["compiled"] and not p["valid"] for p in report["problems"])  # compiled, never timed
    for plot in PLOTS:
        assert (store.report_dir / plot).stat().st_size > 1000
    steps = store.steps()
    assert len(steps) == 2 * 2 * 2
    assert report["candidates"] == sum(len(u.attempts) for u in [*store.initials().values(), *steps])
    # tokens in the report are exactly what the server reported for the answered requests
    served = [r for r in requests if r.answered_status == 200]
    assert report["tokens"]["by_role"].keys() == {"generate", "lower", "review", "evaluate", "analyze", "update"}
    assert sum(c["calls"] for c in report["tokens"]["by_role"].values()) == len(served)
    prompt = sum(max(1, sum(len(m["content"]) for m in r.messages) // 4) for r in served)
    assert sum(c["prompt_tokens"] for c in report["tokens"]["by_role"].values()) == prompt
    best = (store.root / "best" / "swish.py").read_text()
    assert "UNVERIFIED" in best and "class ModelNew" in best


def test_generation_survives_refusal_prose_and_compile_errors(campaign) -> None:
    _, _, store, requests = campaign
    swish = [r for r in requests if r.role == "generate" and r.problem == "swish"]
    assert len(swish) == 3
    assert "declined the task" in swish[1].last_user and "No Python module" in swish[2].last_user
    initials = store.initials()
    assert initials["swish"].accepted and initials["swish"].final.verdict.value == "needs_gpu"
    chain = initials["elementwise_chain_small"]
    assert [a.verdict.value for a in chain.attempts] == ["compile_error", "needs_gpu"]
    fix = [r for r in requests if r.role == "generate" and "verdict: compile_error" in r.last_user]
    assert len(fix) == 1 and 'expected a ";"' in fix[0].last_user  # nvcc's own message went back


def test_steps_lower_fix_review_and_record(campaign) -> None:
    _, kb, store, requests = campaign
    steps = store.steps()
    # no profile: the state comes from the references' operations (both are elementwise chains), and
    # optimizations for work they do not do (attention, GEMM, convolution...) are never drawn
    assert all(s.state_id == "memory_bandwidth_saturated" and s.state_source == "fallback" for s in steps)
    assert all(s.optimization_id and s.suggestions for s in steps)
    drawn = {o.optimization_id for s in steps for o in s.suggestions}
    assert not drawn & {"flash_attention_tiling", "online_softmax", "use_tensor_cores_mma", "implicit_gemm_convolution"}
    fixed = [s for s in steps if [a.verdict.value for a in s.attempts] == ["compile_error", "needs_gpu"]]
    assert fixed, "a lowering step should have been fixed after nvcc's message"
    failed = [s for s in steps if s.verdict is not None and s.verdict.value == "compile_error"]
    assert failed and all(len(s.attempts) == 2 and s.outcome_recorded for s in failed)
    rejected = [s for s in steps if s.review is not None and not s.review.accepted]
    assert rejected and all(not s.accepted and not s.outcome_recorded for s in rejected)
    assert all("swish_chunks" in store.kernel_source(s.problem, s.candidate_id) for s in rejected)
    # the review's issue went back to the model as a fix request, and each candidate keeps its review
    asked = [r for r in requests if r.role == "lower" and "code review rejected" in r.last_user]
    assert asked and "last partial chunk" in asked[0].last_user
    assert all(len(s.attempts) == 2 and all(a.review and not a.review.accepted for a in s.attempts) for s in rejected)

    fresh = KBStore.open(kb)
    recorded = [s for s in steps if s.outcome_recorded]
    with fresh.read() as view:
        outcomes = {o.id: o for o in view.outcomes()}
        assert len(outcomes) == len({(s.candidate_id, s.optimization_id) for s in recorded})
        scores = [view.get_score("memory_bandwidth_saturated", opt) for opt in {s.optimization_id for s in failed}]
        compile_failures = sum(score.compile_failures for score in scores if score is not None)
    assert compile_failures >= 1  # compile failures reached the KB's numbers
    assert {o.verdict.value for o in outcomes.values()} >= {"needs_gpu", "compile_error"}


def test_textual_gradient_edited_the_kb(campaign) -> None:
    _, kb, store, requests = campaign
    gradients = store.gradients()
    recorded = [s for s in store.steps() if s.outcome_recorded]
    assert len(gradients) == len(recorded) // 3 >= 1
    for g in gradients:
        assert [e["kind"] for e in g.applied] == ["add_lesson", "adjust_prior"], [r.reason for r in g.rejected]
        assert len(g.rejected) == 2 and any("unknown state" in r.reason for r in g.rejected)
        assert g.kb_after.lessons >= g.kb_before.lessons
    fresh = KBStore.open(kb)
    lesson_pairs = {(e["state_id"],
                     e["optimization_id"]) for g in gradients for e in g.applied if e["kind"] == "add_lesson"}
    for state_id, opt_id in lesson_pairs:
        lessons = fresh.lessons(state_id, opt_id)
        assert any(lesson.source == "textual_gradient" for lesson in lessons)
    update_prompts = [r for r in requests if r.role == "update"]
    assert len(update_prompts) == len(gradients)
    assert gradients[-1].kb_after.lessons > store.kb_start().lessons
