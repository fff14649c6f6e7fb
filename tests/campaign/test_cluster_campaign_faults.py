"""A scripted campaign on a running Dask scheduler (`run-campaign --cluster ADDRESS`, two CPU worker
processes, compile-only checks, real nvcc, a real KB) whose coordinator is killed mid-run and started
again, and one of whose workers is killed while it verifies: the resumed run keeps every finished step,
re-runs the lost verification on the other worker and says so, and the KB holds each verdict once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from campaign_helpers import CHAIN, SWISH, campaign_command, campaign_env, slow_campaign_script, start_campaign
from cluster_helpers import slow_to_load
from fakellm import FakeLLMServer

from kb_mcp.campaign.cluster import Cluster
from kb_mcp.campaign.cluster_models import ClusterPlan, local_workers
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.kb import ids
from kb_mcp.kb.store import KBStore
from kb_mcp.tools.context import ToolContext

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

STEPS = 3
LOAD_S = 1.5  # each problem's load: every verification lasts that long at least, so a kill lands inside one
FLAGS = ("--compile-only", "--iterations", "1", "--steps", str(STEPS), "--gradient-every", "0",
         "--fix-attempts", "2", "--generate-attempts", "3", "--parallel", "2")




def _wait(what: str, done, proc, timeout: float = 180) -> None:
    """Waits until `done()`; fails (killing `proc`) if `proc` ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        if proc.poll() is not None:
            pytest.fail(f"the campaign exited with {proc.returncode} before {what}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"timed out waiting for {what}")


def _running(cluster: Cluster, proc, log: Path, timeout: float = 120) -> str:
    """The address of a worker running a verification, once one does; fails with the campaign's output
    where it ends first."""
    def processing(dask_scheduler=None) -> list[str]:
        return [ws.address for ws in dask_scheduler.workers.values() if ws.processing]

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = cluster.client.run_on_scheduler(processing)
        if busy:
            return busy[0]
        if proc.poll() is not None:
            pytest.fail(f"the campaign exited with {proc.returncode} before a verification ran:\n{log.read_text()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"no verification started on the cluster:\n{log.read_text()}")


def _idle(cluster: Cluster, timeout: float = 120) -> None:
    """Waits until no worker runs a task (a killed coordinator's verifications in flight have ended)."""
    def processing(dask_scheduler=None) -> int:
        return sum(len(ws.processing) for ws in dask_scheduler.workers.values())

    deadline = time.monotonic() + timeout
    while cluster.client.run_on_scheduler(processing) and time.monotonic() < deadline:
        time.sleep(0.1)


def _check_kb(kb: Path, store: CampaignStore) -> None:
    """One verdict per key for every candidate the folder records, and every recorded outcome in the KB
    once (at most the one step lost to the coordinator's kill recorded without its file)."""
    steps = store.steps()
    with KBStore.open(kb).read() as view:
        for unit in [*store.initials().values(), *steps]:
            for attempt in unit.attempts:
                verdicts = view.candidate_verdicts(attempt.candidate_id)
                assert len(verdicts) == len({v.key for v in verdicts}) >= 1, unit
        in_kb = view.outcome_ids()
    mine = {ids.outcome_id(s.candidate_id, s.optimization_id) for s in steps if s.outcome_recorded}
    assert mine and mine <= in_kb and len(in_kb - mine) <= 2  # one lost step per problem in flight at most


def test_a_campaign_survives_its_coordinator_and_a_worker_killed(tmp_path: Path) -> None:
    kb, out = tmp_path / "kb.json", tmp_path / "camp"
    hosts = ToolContext(tmp_path / "host-kb.json")  # the workers' host: its KB is hidden from their sandboxes
    try:
        with Cluster(ClusterPlan(workers=local_workers(2, [], compile_only=True), processes=True),
                     hosts.private_places) as cluster, FakeLLMServer(slow_campaign_script()) as server:
            env, address = campaign_env(server, tmp_path / "home"), cluster.client.scheduler.address
            store = CampaignStore(out)
            problems = [slow_to_load(p, tmp_path / "problems" / p.name, LOAD_S) for p in (SWISH, CHAIN)]
            first = start_campaign(campaign_command(kb, out, problems, *FLAGS, "--cluster", address),
                                   env, tmp_path / "first.log")
            _wait("a step finished", lambda: len(store.steps()) >= 1, first)
            first.kill()
            first.wait(timeout=30)
            before = {s.key: s for s in store.steps()}
            assert 1 <= len(before) < 2 * STEPS, (tmp_path / "first.log").read_text()
            _idle(cluster)

            # the resumed run (the folder's stored configuration); a worker killed while it verifies
            second = start_campaign(campaign_command(kb, out, [], "--cluster", address), env,
                                    tmp_path / "second.log")
            worker = _running(cluster, second, tmp_path / "second.log")
            time.sleep(0.2)  # inside the verification (LOAD_S at least)
            victim = cluster.worker_pids()[worker]
            os.kill(victim, signal.SIGKILL)
            assert second.wait(timeout=240) == 0, (tmp_path / "second.log").read_text()
            assert victim not in cluster.worker_pids().values()  # dead (its nanny may have started another)
    finally:
        hosts.close()
    log = (tmp_path / "second.log").read_text()
    assert "re-run on another worker after theirs died" in log, log
    assert "re-run on another worker after theirs died" in (store.report_dir / "report.md").read_text()
    status = store.read_status()
    assert status is not None and status.state == "finished" and status.runs == 2
    after = {s.key: s for s in store.steps()}
    assert len(after) == 2 * STEPS
    assert all(after[key] == step for key, step in before.items())  # finished steps kept, not redone
    _check_kb(kb, store)
