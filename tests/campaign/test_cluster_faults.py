"""A worker of the cluster whose harness cannot run (a real Dask worker process whose every Python
child dies at start: its sandbox cannot be probed, or its harness worker exits) is withdrawn (its
`GPU` slot set to 0, so the scheduler sends it nothing more) and each task it failed re-runs on
another worker; where every worker is withdrawn, the eval's problems say so. Compile-only checks
on CPU workers, real nvcc, a real KB."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.campaign.cluster import Cluster
from kb_mcp.campaign.cluster_models import ClusterPlan, WorkerSpec
from kb_mcp.campaign.eval_models import EvalOptions
from kb_mcp.campaign.evaluate import evaluate
from kb_mcp.tools.context import ToolContext

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

TREE = Path(__file__).resolve().parent / "kernelbench_tree"
VERDICTS = {"1_Scale": "needs_gpu", "2_Add_Bias": "needs_gpu", "1_Scale_Add_ReLU": "compile_error"}
MARK = "KB_MCP_TEST_DASK_WORKER"
SITE = f"""import os
if not os.environ.get({MARK!r}):
    os._exit(3)  # a Python started by this worker (the sandbox's probe, a harness worker) dies at once
"""


def _broken_env(tmp_path: Path, sandbox: str) -> dict[str, str]:
    """The environment of a worker whose harness cannot run: every Python it starts (its environment
    scrubbed of MARK, as the sandbox scrubs it) finds this sitecustomize and exits."""
    site = tmp_path / "broken-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    env = {"PYTHONPATH": str(site), MARK: "1", "KB_MCP_SANDBOX_RO": str(site)}  # the sandbox shows the folder
    if sandbox == "unconfined":
        env["KB_MCP_SANDBOX"] = "unconfined"  # no probe: the harness worker itself dies
    return env


def _options() -> EvalOptions:
    return EvalOptions(problems=[str(TREE)], solutions=str(TREE / "solutions"), compile_only=True)


@pytest.mark.parametrize("sandbox", ["bwrap", "unconfined"])
def test_a_worker_whose_harness_cannot_run_is_withdrawn_and_its_problems_run_elsewhere(tmp_path: Path,
                                                                                       sandbox: str) -> None:
    plan = ClusterPlan(workers=[WorkerSpec(name="cpu-0"),
                                WorkerSpec(name="cpu-1", environ=_broken_env(tmp_path, sandbox))])
    ctx = ToolContext(tmp_path / "kb.json")
    try:
        with Cluster(plan, ctx.private_places) as cluster:
            assert cluster.capacity == 2
            result = evaluate(tmp_path / "out", ctx, _options(), cluster=cluster)
            assert cluster.capacity == 1 and list(cluster.withdrawn) == ["cpu-1"]
            assert "cpu-1" in cluster.withdrawn and "could not run" in cluster.withdrawn["cpu-1"]
    finally:
        ctx.close()
    lines = {line.problem: line for line in result.lines if line.problem in VERDICTS}
    assert {p: (line.verdict.value if line.verdict else line.note) for p, line in lines.items()} == VERDICTS
    assert all(line.worker and line.worker.startswith("cpu-0") for line in lines.values())
    moved = [r for r in result.retried if r.withdrawn]
    assert len(moved) == 1 and moved[0].withdrawn == ["cpu-1"]  # withdrawn once: it took no second task
    assert any("withdrawn (cpu-1)" in note for note in result.report.notes), result.report.notes


def test_with_every_worker_withdrawn_each_problem_says_so(tmp_path: Path) -> None:
    env = _broken_env(tmp_path, "unconfined")
    plan = ClusterPlan(workers=[WorkerSpec(name="cpu-0", environ=env), WorkerSpec(name="cpu-1", environ=env)])
    ctx = ToolContext(tmp_path / "kb.json")
    try:
        with Cluster(plan, ctx.private_places) as cluster:
            result = evaluate(tmp_path / "out", ctx, _options(), cluster=cluster)
            assert cluster.capacity == 0 and sorted(cluster.withdrawn) == ["cpu-0", "cpu-1"]
    finally:
        ctx.close()
    lines = [line for line in result.lines if line.problem in VERDICTS]
    assert len(lines) == 3 and all(line.verdict is None for line in lines)
    notes = [line.note for line in lines]
    assert all("could not run" in note or "withdrawn" in note for note in notes), notes
