"""A campaign killed mid-run (SIGKILL) or interrupted (SIGINT) leaves only whole files, and a rerun
continues where it stopped instead of starting over."""

from __future__ import annotations

import itertools
import json
import signal
import time
from pathlib import Path

import pytest
from campaign_helpers import (
    CHAIN,
    SWISH,
    campaign_command,
    campaign_env,
    run_campaign_process,
    slow_campaign_script,
    start_campaign,
)
from fakellm import Answer, FakeLLMServer, Rule, Script
from fakellm.campaign_script import campaign_script

from kb_mcp.campaign.store import CampaignStore
from kb_mcp.kb import ids
from kb_mcp.kb.store import KBStore

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

STEPS = 4
FLAGS = ("--compile-only", "--iterations", "1", "--steps", str(STEPS), "--gradient-every", "2", "--fix-attempts", "2")


def _wait_for_steps(folder: Path, n: int, proc, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(list((folder / "raw" / "steps").glob("*/i*_s*.json"))) >= n:
            return
        if proc.poll() is not None:
            pytest.fail(f"campaign exited early with {proc.returncode}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail("no step finished in time")


def _sigint_is_handled(pid: int) -> bool:
    """Whether process `pid` catches SIGINT (Python's KeyboardInterrupt handler), per /proc."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    return bool(int(fields["SigCgt"], 16) & (1 << (signal.SIGINT - 1)))


def _all_json_whole(folder: Path) -> int:
    """Every record file parses; returns how many there are."""
    files = list(folder.rglob("*.json"))
    for path in files:
        json.loads(path.read_text())
    return len(files)


def _check_finished(store: CampaignStore, kb: Path, runs: int) -> None:
    status = store.read_status()
    assert status.state == "finished" and status.runs == runs
    steps = store.steps()
    assert [(s.iteration, s.step) for s in steps] == [(0, i) for i in range(STEPS)]
    for earlier, later in itertools.pairwise(steps):  # each step started from where the previous left off
        expected_parent = earlier.candidate_id if earlier.accepted else earlier.parent_candidate_id
        assert later.parent_candidate_id == expected_parent
    report = json.loads((store.report_dir / "report.json").read_text())
    assert report["candidates"] == sum(len(u.attempts) for u in [*store.initials().values(), *steps])
    with KBStore.open(kb).read() as view:
        in_kb = view.outcome_ids()
    mine = {ids.outcome_id(s.candidate_id, s.optimization_id) for s in steps if s.outcome_recorded}
    assert mine <= in_kb  # every recorded step is in the KB exactly once (ids are unique)
    assert len(in_kb - mine) <= 1  # at most the outcome of the one step lost to the kill


def test_resume_after_sigkill(tmp_path: Path) -> None:
    kb, out = tmp_path / "kb.json", tmp_path / "camp"
    with FakeLLMServer(slow_campaign_script()) as server:
        env = campaign_env(server, tmp_path / "home")
        cmd = campaign_command(kb, out, [SWISH], *FLAGS)
        proc = start_campaign(cmd, env, tmp_path / "first.log")
        _wait_for_steps(out, 1, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        store = CampaignStore(out)
        assert _all_json_whole(out) >= 3
        before = {s.key: s for s in store.steps()}
        assert 1 <= len(before) < STEPS
        generated = len(server.requests_for("generate"))

        # no problems, no flags: the folder's stored configuration is resumed
        second = run_campaign_process(campaign_command(kb, out, []), env)
        assert second.returncode == 0, second.stdout + second.stderr
        assert len(server.requests_for("generate")) == generated  # the first kernel was not generated again
    after = {s.key: s for s in store.steps()}
    for key, step in before.items():
        assert after[key] == step  # finished steps were kept, not redone
    _check_finished(store, kb, runs=2)


def test_interrupt_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    kb, out = tmp_path / "kb.json", tmp_path / "camp"
    with FakeLLMServer(slow_campaign_script()) as server:
        env = campaign_env(server, tmp_path / "home")
        proc = start_campaign(campaign_command(kb, out, [SWISH], *FLAGS), env, tmp_path / "first.log")
        _wait_for_steps(out, 1, proc)
        assert _sigint_is_handled(proc.pid), "the campaign process ignores SIGINT: the test could not interrupt it"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, (tmp_path / "first.log").read_text()
        store = CampaignStore(out)
        status = store.read_status()
        assert status.state == "stopped" and "interrupted" in status.message
        _all_json_whole(out)
        assert "Rerun the same command to resume" in (tmp_path / "first.log").read_text()
        second = run_campaign_process(campaign_command(kb, out, [SWISH], *FLAGS), env)
        assert second.returncode == 0, second.stdout + second.stderr
    _check_finished(store, kb, runs=2)


def _failing(role: str, answer: Answer) -> Script:
    """The scripted campaign with every answer to `role` replaced by `answer`."""
    script = campaign_script()
    script.rules.insert(0, Rule(role=role, answers=[answer]))
    return script


def test_resume_runs_the_gradient_batch_a_failed_endpoint_left(tmp_path: Path) -> None:
    kb, out = tmp_path / "kb.json", tmp_path / "camp"
    # three steps: the batch of the two outcomes (s0, s2) falls due when every step has finished
    cmd = campaign_command(kb, out, [SWISH], *FLAGS[:3], "--steps", "3", *FLAGS[5:])
    with FakeLLMServer(_failing("evaluate", Answer(status=503, text="overloaded"))) as server:
        first = run_campaign_process(cmd, campaign_env(server, tmp_path / "home"))
    assert first.returncode == 3, first.stdout + first.stderr  # the endpoint's fault, after its retries
    store = CampaignStore(out)
    assert len(store.steps()) == 3 and store.gradients() == []  # every step kept
    with FakeLLMServer(campaign_script()) as server:
        second = run_campaign_process(cmd, campaign_env(server, tmp_path / "home"))
        assert second.returncode == 0, second.stdout + second.stderr
        assert server.requests_for("lower") == []  # no step redone
    assert [g.index for g in store.gradients()] == [1]  # the batch the failure left, run now
    assert "kept 1 of 1 first kernels, 3 of 3 steps" in second.stderr


def test_a_garbage_llm_reply_stops_the_campaign_as_the_environments_fault(tmp_path: Path) -> None:
    with FakeLLMServer(_failing("generate", Answer(body="<html>502 bad gateway</html>"))) as server:
        done = run_campaign_process(campaign_command(tmp_path / "kb.json", tmp_path / "camp", [SWISH], *FLAGS),
                                    campaign_env(server, tmp_path / "home"))
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert "not a chat completion" in done.stdout and "rerun the same command to resume" in done.stdout


def test_a_rerun_with_other_problems_or_models_says_what_differs(tmp_path: Path) -> None:
    kb, out = tmp_path / "kb.json", tmp_path / "camp"
    with FakeLLMServer(_failing("generate", Answer(status=500, text="down"))) as server:
        env = campaign_env(server, tmp_path / "home")
        assert run_campaign_process(campaign_command(kb, out, [SWISH], *FLAGS), env).returncode == 3
        other = run_campaign_process(campaign_command(kb, out, [CHAIN], *FLAGS), env)
        assert other.returncode == 1 and "Traceback" not in other.stderr
        assert f"only the campaign holds: {SWISH}" in other.stderr and f"only given now: {CHAIN}" in other.stderr
        model = run_campaign_process(campaign_command(kb, out, [], "--llm-model-for", "review=small"), env)
    assert "model for review: fake-model -> small" in model.stderr, model.stderr
    assert "model for lower" not in model.stderr  # only what changed


def test_a_record_that_cannot_be_read_on_resume_leaves_the_header_failed_not_running(tmp_path: Path) -> None:
    kb, out = tmp_path / "kb.json", tmp_path / "camp"
    cmd = campaign_command(kb, out, [SWISH], *FLAGS)
    with FakeLLMServer(_failing("generate", Answer(status=500, text="down"))) as server:
        env = campaign_env(server, tmp_path / "home")
        assert run_campaign_process(cmd, env).returncode == 3
        step = out / "raw" / "steps" / "swish" / "i000_s000.json"
        step.parent.mkdir(parents=True, exist_ok=True)
        step.symlink_to(tmp_path / "gone.json")  # listed by the folder, nothing to read
        again = run_campaign_process(cmd, env)
    assert again.returncode == 3 and "Traceback" not in again.stderr, again.stdout + again.stderr
    status = CampaignStore(out).read_status()
    assert status is not None and status.runs == 2
    assert status.state == "failed" and str(step) in status.message, status  # not left "running"
