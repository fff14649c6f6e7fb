"""`kb-mcp eval --baselines --gpus N` (and `--cluster`): the baselines table timed on a cluster's
workers, one task per problem, written by the coordinator alone after each row and resumable, on a
real Dask cluster of two CPU workers (whose harness finds no GPU, so every row is `needs_gpu`: what
the path does, not a timing). On GPUs: tests/campaign/test_cluster_gpu.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kb_mcp.campaign.baselines_eval import BaselineRow, baselines_table, read_table
from kb_mcp.campaign.cluster import Cluster
from kb_mcp.campaign.cluster_models import ClusterPlan, local_workers
from kb_mcp.tools.context import ToolContext

pytestmark = [pytest.mark.slow, pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU workers' answer")]

TREE = Path(__file__).resolve().parent / "kernelbench_tree"
PROBLEMS = {(1, "1_Scale"), (1, "2_Add_Bias"), (1, "3_Square"), (2, "1_Scale_Add_ReLU")}


def test_a_cluster_times_each_problem_once_and_the_coordinator_writes_a_row_as_each_returns(tmp_path: Path) -> None:
    out = tmp_path / "out" / "baselines.json"
    done = BaselineRow(level=1, problem="2_Add_Bias", status="ok", eager_ms=0.5, compile_ms=0.4, peak_gib=0.1)
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps([done.model_dump(mode="json")]))
    seen: list[tuple[int, int]] = []  # (rows done, rows in the file) at each row's progress

    def progress(problem: str, finished: int, total: int, message: str) -> None:
        if problem and finished:
            seen.append((finished, len(read_table(out))))

    said: list[str] = []
    ctx = ToolContext(tmp_path / "kb.json")
    try:
        with Cluster(ClusterPlan(workers=local_workers(2, [], compile_only=True), processes=False),
                     ctx.private_places) as cluster:
            rows = baselines_table(out, ctx, [str(TREE)], log=said.append, progress=progress, cluster=cluster)
            assert cluster.retried == []
            again = baselines_table(out, ctx, [str(TREE)], level=2, cluster=cluster)  # needs_gpu: tried again
    finally:
        ctx.close()
    assert {(r.level, r.problem) for r in rows} == PROBLEMS
    by_name = {r.problem: r for r in rows}
    assert by_name["2_Add_Bias"] == done  # already done: kept, not sent again
    others = [r for r in rows if r.problem != "2_Add_Bias"]
    assert all(r.status == "needs_gpu" and "no CUDA GPU" in r.note for r in others), others
    assert {r.worker.split(" ")[0] for r in others} <= {"cpu-0", "cpu-1"} and all(r.worker for r in others)
    assert seen == [(1, 2), (2, 3), (3, 4)]  # the table written after each row, one row more each time
    assert sum("[cpu-" in line for line in said) == 3 and any("already in" in line for line in said)
    assert [r.problem for r in again] == [r.problem for r in rows]
    assert not [p for p in out.parent.iterdir() if p.name != "baselines.json"]  # no temp file left


def _eval(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KB_MCP_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp_path / "kb.json"), "eval", str(TREE),
           "--baselines", "--no-progress", "--out", str(tmp_path / "out"), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_the_cli_takes_gpus_for_baselines_and_says_this_machine_has_none(tmp_path: Path) -> None:
    proc = _eval(tmp_path, "--gpus", "2")
    assert proc.returncode == 3 and "timing baselines needs a CUDA GPU" in proc.stderr, proc.stderr  # the machine's
    proc = _eval(tmp_path, "--cluster", "tcp://127.0.0.1:9", "--gpus", "2")
    assert proc.returncode == 2 and "give one of them" in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "baselines.json").exists()


def test_the_cli_times_baselines_on_a_running_scheduler_without_a_gpu_of_its_own(tmp_path: Path) -> None:
    """`--cluster` needs no GPU in the coordinator: the workers have them (here: CPU workers, needs_gpu)."""
    ctx = ToolContext(tmp_path / "host-kb.json")  # the hosts' own: its KB is hidden from their sandboxes
    try:
        with Cluster(ClusterPlan(workers=local_workers(2, [], compile_only=True), processes=False),
                     ctx.private_places) as running:
            proc = _eval(tmp_path, "--cluster", running.client.scheduler.address)
    finally:
        ctx.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_table(tmp_path / "out" / "baselines.json")
    assert {(r.level, r.problem) for r in rows} == PROBLEMS and all(r.status == "needs_gpu" for r in rows)
    assert "timing baselines on the Dask cluster at" in proc.stdout + proc.stderr
