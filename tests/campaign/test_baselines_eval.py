"""`kb-mcp eval --baselines`: the per-GPU table of eager and torch.compile times (`campaign.baselines_eval`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kb_mcp.campaign.baselines_eval import BaselineRow, BaselinesError, baselines_table, eta_text, read_table
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.tools.context import ToolContext

TREE = Path(__file__).resolve().parent / "kernelbench_tree"
HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def ctx(tmp_path: Path):
    c = ToolContext(tmp_path / "kb.json", cache_dir=tmp_path / "cache")
    if not HAS_CUDA:
        c.__dict__["workers"] = WorkerPool(c.cache_dir, no_cuda=True)
    yield c
    c.close()


@pytest.mark.skipif(HAS_CUDA, reason="what a machine without a GPU says")
def test_without_a_gpu_the_cli_says_baselines_need_one(tmp_path: Path) -> None:
    env = {**os.environ, "KB_MCP_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp_path / "kb.json"), "eval", str(TREE),
           "--no-progress", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 3 and "timing baselines needs a CUDA GPU" in proc.stderr, proc.stderr  # the machine's
    assert not (tmp_path / "out" / "baselines.json").exists()


@pytest.mark.skipif(HAS_CUDA, reason="the CPU pool's answer")
def test_the_table_is_written_per_problem_and_a_rerun_skips_what_is_done(ctx, tmp_path: Path) -> None:
    out = tmp_path / "out" / "baselines.json"
    done = BaselineRow(level=1, problem="1_Scale", status="ok", eager_ms=0.5, compile_ms=0.4, peak_gib=0.1)
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps([done.model_dump(mode="json")]))
    said: list[str] = []
    rows = baselines_table(out, ctx, [str(TREE)], level=1, log=said.append)
    by_name = {r.problem: r for r in rows}
    assert by_name["1_Scale"] == done  # kept as it was: not timed again
    others = [r for r in rows if r.problem != "1_Scale"]
    assert others and all(r.status == "needs_gpu" and r.level == 1 for r in others)
    assert any("already in" in line for line in said)
    assert read_table(out) == rows  # what was written is what was returned, in order
    # needs_gpu is not done: a rerun tries those again, and keeps the finished one
    again = baselines_table(out, ctx, [str(TREE)], level=1)
    assert {r.problem for r in again} == {r.problem for r in rows} and again[0] == rows[0]


def test_a_file_that_is_not_a_table_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    path.write_text('{"not": "a list"}')
    with pytest.raises(BaselinesError, match="not a baselines table"):
        read_table(path)
    assert read_table(tmp_path / "missing.json") == []


def test_the_eta_comes_from_the_problems_done() -> None:
    assert eta_text([], 10).startswith("ETA unknown")
    assert eta_text([30.0, 50.0], 3) == "ETA 2 min"
    assert eta_text([4.0], 5) == "ETA 20 s"


def test_a_row_keeps_the_runs_steps_and_its_line_names_them() -> None:
    from kb_mcp.campaign.baselines_eval import _describe, row_of
    from kb_mcp.campaign.selection import ProblemRef
    from kb_mcp.harness.baselines import Baseline, BaselineRun

    run = BaselineRun(problem="p", problem_hash="h", status="ok", elapsed_s=12.5,
                      baseline=Baseline(problem_hash="h", device="d", torch_version="t", eager_ms=1.0, eager_runs=10,
                                        compile_ms=2.0),
                      phases={"load": 0.2, "construct": 1.0, "eager": 1.5, "compile": 8.0, "compile_timed": 1.2})
    row = row_of(ProblemRef(path=TREE / "level1" / "7_x.py", level=1, id=7), run, "fp32")
    assert row.phases_s == run.phases
    line = _describe(row)
    assert "(12.5 s: load 0.2, construct 1.0, eager 1.5, compile 8.0, compile_timed 1.2)" in line, line
    assert BaselineRow.model_validate_json(row.model_dump_json()).phases_s == run.phases


@pytest.mark.gpu
def test_on_a_gpu_every_problem_of_the_tree_gets_both_baselines(ctx, tmp_path: Path) -> None:
    out = tmp_path / "baselines.json"
    rows = baselines_table(out, ctx, [str(TREE)])
    assert rows and all(r.status == "ok" for r in rows), [(r.problem, r.status, r.note) for r in rows]
    for r in rows:
        assert r.eager_ms and r.eager_ms > 0 and r.compile_ms and r.compile_ms > 0 and r.device
        assert r.peak_gib is not None and r.peak_gib < 4
        # where the time went, step by step, and nothing left out of the worker's share
        worker = [k for k in r.phases_s if k in ("load", "construct", "eager", "compile", "compile_timed")]
        assert worker == ["load", "construct", "eager", "compile", "compile_timed"], r.phases_s
        assert list(r.phases_s)[:2] == ["lane", "worker_start"] and list(r.phases_s)[-1] == "worker_restart"
        assert all(v >= 0 for v in r.phases_s.values()), r.phases_s
        assert abs(sum(r.phases_s.values()) - r.elapsed_s) < 0.1 + 0.01 * r.elapsed_s, (r.phases_s, r.elapsed_s)
        # torch.compile leaves nothing running in the worker: no new worker started per problem
        assert not r.worker_retired, r.problem
    said: list[str] = []
    assert baselines_table(out, ctx, [str(TREE)], log=said.append) == rows
    assert any(f"{len(rows)} of {len(rows)} problems already in" in line for line in said)
