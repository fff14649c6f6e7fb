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
    SWISH,
    campaign_command,
    campaign_env,
    run_campaign_process,
    slow_campaign_script,
    start_campaign,
)
from fakellm import FakeLLMServer

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
