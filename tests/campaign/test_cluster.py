"""Evals and campaigns on a real Dask cluster of two CPU workers (compile-only checks, real nvcc, a real
KB): the eval end to end, a scripted campaign end to end, a worker killed while it verifies (its
problem re-run on another worker process, and said so), and the coordinator killed mid-eval and
started again (every problem done once, one verdict per key in the KB).

The kill test needs worker processes (a thread cannot be killed); the other in-process runs use
threads, which schedule the same tasks through the same scheduler."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from campaign_helpers import CHAIN, SWISH, campaign_command, campaign_env, run_campaign_process
from cluster_helpers import running_on, slow_to_load
from fakellm import FakeLLMServer
from fakellm.campaign_script import campaign_script

from kb_mcp.campaign.cluster import Cluster
from kb_mcp.campaign.cluster_models import ClusterPlan, local_workers, thread_share
from kb_mcp.campaign.eval_models import EvalOptions, EvalResult
from kb_mcp.campaign.evaluate import evaluate
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.kb.store import KBStore
from kb_mcp.tools.context import ToolContext

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

TREE = Path(__file__).resolve().parent / "kernelbench_tree"
SOLUTIONS = TREE / "solutions"
VERDICTS = {"1_Scale": "needs_gpu", "2_Add_Bias": "needs_gpu", "1_Scale_Add_ReLU": "compile_error"}


def _plan(processes: bool) -> ClusterPlan:
    return ClusterPlan(workers=local_workers(2, [], compile_only=True), processes=processes)


def _options() -> EvalOptions:
    return EvalOptions(problems=[str(TREE)], solutions=str(SOLUTIONS), compile_only=True)


def _one_verdict_per_candidate(kb: Path, store: CampaignStore) -> None:
    """The KB holds exactly one verdict for each evaluated solution, the one the folder records."""
    with KBStore.open(kb).read() as view:
        for record in store.initials().values():
            verdicts = view.candidate_verdicts(record.candidate_id)
            assert [v.verdict for v in verdicts] == [record.verdict], record.problem


def test_an_eval_spreads_over_two_workers(tmp_path: Path) -> None:
    ctx = ToolContext(tmp_path / "kb.json")
    try:
        with Cluster(_plan(processes=False), ctx.private_places) as cluster:
            assert cluster.capacity == 2
            result = evaluate(tmp_path / "out", ctx, _options(), cluster=cluster)
    finally:
        ctx.close()
    verified = {line.problem: line for line in result.lines if line.verdict is not None}
    assert {k: v.verdict.value for k, v in verified.items()} == VERDICTS
    assert {line.worker.split(" ")[0] for line in verified.values()} <= {"cpu-0", "cpu-1"}
    assert all(line.times and line.times.verify_s > 0 for line in verified.values())
    assert result.retried == [] and not any("re-run" in n for n in result.report.notes)
    store = CampaignStore(tmp_path / "out")
    assert set(store.initials()) == set(VERDICTS)
    _one_verdict_per_candidate(tmp_path / "kb.json", store)
    assert "3_Square" in {line.problem for line in result.lines if line.verdict is None}


def test_a_worker_killed_mid_verification_has_its_problem_rerun(tmp_path: Path) -> None:
    ctx = ToolContext(tmp_path / "kb.json")
    done: dict[str, EvalResult] = {}
    threads = os.environ.get("OMP_NUM_THREADS")
    try:
        with Cluster(_plan(processes=True), ctx.private_places) as cluster:
            pids = cluster.worker_pids()
            # each worker process has its share of the cores, not Dask's one thread, and starting
            # them wrote nothing of Dask's into this process's environment
            share = thread_share(2)["OMP_NUM_THREADS"]  # (the user's count, where set)
            assert set(cluster.client.run(os.getenv, "OMP_NUM_THREADS").values()) == {share}
            assert "MALLOC_TRIM_THRESHOLD_" not in os.environ and os.environ.get("OMP_NUM_THREADS") == threads
            run = threading.Thread(target=lambda: done.update(r=evaluate(tmp_path / "out", ctx, _options(),
                                                                         cluster=cluster)))
            run.start()
            address, key = running_on(cluster)
            time.sleep(1.0)  # well inside its verification: the worker's harness is starting
            victim = pids[address]
            os.kill(victim, signal.SIGKILL)
            run.join(timeout=240)
            assert not run.is_alive()
            done["again"] = evaluate(tmp_path / "out", ctx, _options(), cluster=cluster)  # nothing re-run now
    finally:
        ctx.close()
    result = done["r"]
    killed = next(p for p in VERDICTS if key.startswith(f"verify_task-{p}-"))
    assert [(r.problem, r.deaths) for r in result.retried] == [(killed, 1)]
    assert f"re-run on another worker after theirs died: {killed}" in " ".join(result.report.notes)
    lines = {line.problem: line for line in result.lines}
    assert {p: lines[p].verdict.value for p in VERDICTS} == VERDICTS  # the killed problem finished too
    assert f"(pid {victim})" not in lines[killed].worker  # on another worker process
    store = CampaignStore(tmp_path / "out")
    _one_verdict_per_candidate(tmp_path / "kb.json", store)
    assert "re-run on another worker" in (store.report_dir / "report.md").read_text()
    # the folder keeps each run's: the second run re-ran nothing, and its report still says the first's
    assert done["again"].retried == [] and [r.problem for r in store.retried()] == [killed]
    assert f"re-run on another worker after theirs died: {killed}" in " ".join(done["again"].report.notes)


SLOW, SLOW_S = "4_Slow_Scale", 8  # loads for SLOW_S seconds: still verifying when the others are done


def _tree_with_a_slow_problem(tmp: Path) -> Path:
    """A copy of the test tree with one more problem (and its solution) that takes SLOW_S seconds to load,
    so that a coordinator killed once the first verdict is stored has work left, on any machine."""
    tree = tmp / "tree"
    shutil.copytree(TREE, tree)
    level1 = tree / "KernelBench" / "level1"
    slow_to_load(level1 / "1_Scale.py", level1 / f"{SLOW}.py", SLOW_S)
    shutil.copy(tree / "solutions" / "1_Scale.py", tree / "solutions" / f"{SLOW}.py")
    return tree


def _eval_command(tmp: Path, tree: Path) -> list[str]:
    return [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp / "kb.json"), "eval", str(tree),
            "--solutions", str(tree / "solutions"), "--compile-only", "--out", str(tmp / "out"), "--no-progress",
            "--gpus", "2"]


def test_a_coordinator_killed_mid_eval_resumes_with_nothing_twice(tmp_path: Path) -> None:
    env = {**os.environ, "KB_MCP_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    tree, verdicts = _tree_with_a_slow_problem(tmp_path), {**VERDICTS, SLOW: "needs_gpu"}
    log = tmp_path / "first.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(_eval_command(tmp_path, tree), env=env, stdout=out, stderr=subprocess.STDOUT)
        store = CampaignStore(tmp_path / "out")
        deadline = time.monotonic() + 120
        while not store.initials() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.kill()
        proc.wait(timeout=30)
    first = set(store.initials())  # what the killed coordinator had stored, all it will ever store
    # killed with the slow problem (at least) still to verify
    assert first and SLOW not in first and first < set(verdicts), log.read_text()
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"the killed coordinator's workers outlived it: {alive}"

    again = subprocess.run(_eval_command(tmp_path, tree), env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("already evaluated in this folder") == len(set(store.initials()) & first)
    initials = store.initials()
    assert {k: v.verdict.value for k, v in initials.items()} == verdicts
    assert store.read_status().runs == 2 and store.read_status().state == "finished"
    _one_verdict_per_candidate(tmp_path / "kb.json", store)


def test_a_scripted_campaign_runs_across_two_workers(tmp_path: Path) -> None:
    kb, out = tmp_path / "kb.json", tmp_path / "camp"
    with FakeLLMServer(campaign_script()) as server:
        proc = run_campaign_process(
            campaign_command(kb, out, [SWISH, CHAIN], "--compile-only", "--iterations", "1", "--steps", "2",
                             "--gradient-every", "0", "--fix-attempts", "2", "--generate-attempts", "3",
                             "--gpus", "2"),
            campaign_env(server, tmp_path / "home"),
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "a local Dask cluster of 2 CPU worker(s): 2 at once" in proc.stdout + proc.stderr
    store = CampaignStore(out)
    status = store.read_status()
    assert status.state == "finished" and status.config.parallel == 2
    assert len(store.steps()) == 2 * 1 * 2
    assert store.initials()["swish"].final.verdict.value == "needs_gpu"
    # every verification was stored by the coordinator, once per key, and every recorded outcome is there
    with KBStore.open(kb).read() as view:
        for unit in [*store.initials().values(), *store.steps()]:
            for attempt in unit.attempts:
                verdicts = view.candidate_verdicts(attempt.candidate_id)
                assert len(verdicts) == len({v.key for v in verdicts}) >= 1
        recorded = {(s.candidate_id, s.optimization_id) for s in store.steps() if s.outcome_recorded}
        assert recorded and len(view.outcomes()) == len(recorded)
