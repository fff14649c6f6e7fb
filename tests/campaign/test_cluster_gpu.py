"""The cluster on a machine of two or more GPUs: each worker verifies on a device of its own, an eval
spread over them gives the verdicts one GPU gives, a worker killed mid-verification loses nothing, a
scripted campaign across every GPU ends with the KB consistent, and N GPUs verify at least 0.85 x N
times as many problems per minute as one (bench/scale_bench.py's criterion). Run with
scripts/gpu-check.sh tests/campaign/test_cluster_gpu.py on a machine of 2 or more GPUs."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from campaign_helpers import CHAIN, SWISH, campaign_command, campaign_env, run_campaign_process
from cluster_helpers import EXAMPLES, example_solutions, running_on
from fakellm import FakeLLMServer
from fakellm.campaign_script import campaign_script

from kb_mcp.campaign.baselines_eval import baselines_table, read_table
from kb_mcp.campaign.cluster import Cluster
from kb_mcp.campaign.cluster_models import plan_cluster
from kb_mcp.campaign.eval_models import EvalOptions, EvalResult
from kb_mcp.campaign.evaluate import evaluate
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.kb.store import KBStore
from kb_mcp.server.gpu import detect_gpus
from kb_mcp.tools.context import ToolContext

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


@pytest.fixture
def gpus() -> int:
    found = len(detect_gpus())
    if found < 2:
        pytest.skip(f"needs 2 or more GPUs (this machine shows {found})")
    return found


def _two(tmp_path: Path) -> tuple[Cluster, ToolContext]:
    ctx = ToolContext(tmp_path / "kb.json")
    plan = plan_cluster("2", None, gpus_found=len(detect_gpus()), compile_only=False)
    assert plan is not None
    return Cluster(plan, ctx.private_places), ctx


def _gpus_of(workers: Iterable[str | None]) -> set[str]:
    """The GPUs named in workers' names ("gpu-N on HOST (pid P)"; N the machine's own index, so
    under CUDA_VISIBLE_DEVICES=2,3 they are gpu-2 and gpu-3)."""
    names = {str(w).split(" ")[0] for w in workers}
    assert all(n.startswith("gpu-") and n[4:].isdigit() for n in names), names
    return names


def _options(tmp_path: Path) -> EvalOptions:
    return EvalOptions(problems=[str(EXAMPLES / "problems")], solutions=str(example_solutions(tmp_path / "sol")))


def test_each_worker_verifies_on_a_gpu_of_its_own(tmp_path: Path, gpus: int) -> None:
    cluster, ctx = _two(tmp_path)
    try:
        with cluster:
            devices = cluster.warm()
            result = evaluate(tmp_path / "out", ctx, _options(tmp_path), cluster=cluster)
    finally:
        ctx.close()
    uuids = {text.split()[-1] for text in devices.values()}
    assert len(devices) == 2 and len(uuids) == 2 and all(u.startswith(("GPU-", "MIG-")) for u in uuids), devices
    verified = [line for line in result.lines if line.verdict is not None]
    assert len(verified) == 6 and all(line.verdict.value in ("faster", "slower") for line in verified), result.lines
    assert len(_gpus_of(line.worker for line in verified)) == 2, [line.worker for line in verified]


def test_the_baselines_table_is_timed_on_both_gpus(tmp_path: Path, gpus: int) -> None:
    tree = Path(__file__).resolve().parent / "kernelbench_tree"
    out = tmp_path / "baselines.json"
    cluster, ctx = _two(tmp_path)
    try:
        with cluster:
            rows = baselines_table(out, ctx, [str(tree)], cluster=cluster)
    finally:
        ctx.close()
    assert len(rows) == 4 and all(r.status == "ok" for r in rows), [(r.problem, r.status, r.note) for r in rows]
    assert all(r.eager_ms and r.compile_ms and r.device for r in rows)
    assert len(_gpus_of(r.worker for r in rows)) == 2, [r.worker for r in rows]
    assert read_table(out) == rows


def test_a_killed_gpu_worker_loses_nothing(tmp_path: Path, gpus: int) -> None:
    cluster, ctx = _two(tmp_path)
    done: dict[str, EvalResult] = {}
    try:
        with cluster:
            pids = cluster.worker_pids()
            run = threading.Thread(target=lambda: done.update(r=evaluate(tmp_path / "out", ctx, _options(tmp_path),
                                                                         cluster=cluster)))
            run.start()
            address, key = running_on(cluster)
            time.sleep(2.0)  # inside the verification: the worker's harness starts CUDA
            os.kill(pids[address], signal.SIGKILL)
            run.join(timeout=480)
    finally:
        ctx.close()
    result = done["r"]
    killed = key.split("-")[1]
    assert [r.problem for r in result.retried] == [killed]
    line = next(line for line in result.lines if line.problem == killed)
    assert line.verdict is not None and line.verdict.value in ("faster", "slower")
    assert f"(pid {pids[address]})" not in line.worker
    store = CampaignStore(tmp_path / "out")
    with KBStore.open(tmp_path / "kb.json").read() as view:
        for record in store.initials().values():
            assert [v.verdict for v in view.candidate_verdicts(record.candidate_id)] == [record.verdict]


def test_a_campaign_across_every_gpu_keeps_the_kb_consistent(tmp_path: Path, gpus: int) -> None:
    kb, out = tmp_path / "kb.json", tmp_path / "camp"
    with FakeLLMServer(campaign_script()) as server:
        proc = run_campaign_process(
            campaign_command(kb, out, [SWISH, CHAIN], "--iterations", "2", "--steps", "2", "--gradient-every", "2",
                             "--fix-attempts", "2", "--generate-attempts", "3", "--gpus", "all"),
            campaign_env(server, tmp_path / "home"), timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    store = CampaignStore(out)
    assert store.read_status().state == "finished" and len(store.steps()) == 2 * 2 * 2
    with KBStore.open(kb).read() as view:
        recorded = {(s.candidate_id, s.optimization_id) for s in store.steps() if s.outcome_recorded}
        assert len(view.outcomes()) == len(recorded)
        for unit in [*store.initials().values(), *store.steps()]:
            for attempt in unit.attempts:
                verdicts = view.candidate_verdicts(attempt.candidate_id)
                assert len(verdicts) == len({v.key for v in verdicts}) >= 1


def test_n_gpus_verify_at_least_085_n_times_as_fast_as_one(tmp_path: Path, gpus: int) -> None:
    """bench/scale_bench.py's default set (five example problems, copies sized to its 400 s budget)."""
    import json

    import scale_bench

    env = dict(os.environ)
    try:
        code = scale_bench.main(["--out", str(tmp_path), "--echo", "50"])
    finally:
        os.environ.clear()
        os.environ.update(env)  # the bench points KB_MCP_CACHE at its own cache
    s = json.loads((tmp_path / "scale.json").read_text())["summary"]
    print(json.dumps(s, indent=1))
    assert not s["verdicts_differ"], s
    assert s["ratio"] >= s["target"] and code == 0, s  # 0.85 x the GPUs the cluster ran on
