"""`kb-mcp eval` as a real process on a KernelBench-format tree we wrote: solutions matched by name,
each verified through compile_and_verify (compile-only here: real nvcc, verdicts stored in a real KB),
the campaign report written, a rerun skipping what was evaluated, another precision track kept
apart (its own verdict key and its own folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kb_mcp.campaign.store import CampaignStore
from kb_mcp.kb.models import Track
from kb_mcp.kb.store import KBStore
from kb_mcp.server import cmd_eval

TREE = Path(__file__).resolve().parent / "kernelbench_tree"
SOLUTIONS = TREE / "solutions"


def _eval(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KB_MCP_HOME": str(tmp / "home")}
    cmd = [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp / "kb.json"), "eval", *args, "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("eval")
    proc = _eval(tmp, str(TREE), "--solutions", str(SOLUTIONS), "--compile-only", "--out", str(tmp / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp, proc


@pytest.mark.nvcc
def test_each_solution_goes_through_the_harness(first_run) -> None:
    tmp, proc = first_run
    store = CampaignStore(tmp / "out")
    initials = store.initials()
    assert {k: v.verdict.value for k, v in initials.items()} == {
        "1_Scale": "needs_gpu", "2_Add_Bias": "needs_gpu", "1_Scale_Add_ReLU": "compile_error"}
    assert "3_Square" not in initials  # no solution: nothing verified, and the output says so
    assert "3_Square" in proc.stdout and "no solution file matched" in proc.stdout
    assert "timing its baselines needs a GPU" in proc.stdout
    assert "4 problems, track fp32, own kernels 3, compile only: valid rate 0%" in proc.stdout
    # the harness's own compiler message reaches the table of the broken solution
    assert "1_Scale_Add_ReLU" in proc.stdout and "compile_error" in proc.stdout
    # every verdict is the server's, stored in the KB under the candidate id
    with KBStore.open(tmp / "kb.json").read() as kb:
        for record in initials.values():
            stored = kb.get_candidate(record.candidate_id)
            assert stored is not None and stored.verdict == record.verdict
            assert record.problem_path.startswith(str(TREE))


@pytest.mark.nvcc
def test_the_campaign_report_is_written(first_run) -> None:
    tmp, _ = first_run
    report = json.loads((tmp / "out" / "report" / "report.json").read_text())
    assert report["config"]["kind"] == "eval" and report["config"]["track"] == "fp32"
    assert report["mode"] == "compile-only" and report["valid_rate"] == 0.0
    assert [p["problem"] for p in report["problems"]] == ["1_Scale", "2_Add_Bias", "3_Square", "1_Scale_Add_ReLU"]
    assert [p["initial_verdict"] for p in report["problems"]] == ["needs_gpu", "needs_gpu", None, "compile_error"]
    assert set(report["fast_p"]) >= {"0", "1", "2"}
    md = (tmp / "out" / "report" / "report.md").read_text()
    assert md.startswith("# Evaluation report") and "track **fp32**" in md
    # where it ran and how each problem was judged, two things apart: "mode" is the verification's
    assert "Run: **compile only**" in md and "verification mode: own kernels 3" in md and "gpu" not in md.split("\n")[2]
    assert "| 3_Square | own kernels | (no solution) |" in md
    assert "## Tokens" not in md  # no LLM in an eval


@pytest.mark.nvcc
def test_a_rerun_skips_what_was_evaluated_and_a_selection_narrows_it(first_run) -> None:
    tmp, _ = first_run
    proc = _eval(tmp, str(TREE), "--solutions", str(SOLUTIONS), "--level", "1", "--problems", "1-2",
                 "--compile-only", "--out", str(tmp / "out"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("already evaluated in this folder") == 2
    assert "1_Scale_Add_ReLU" not in proc.stdout.split("\n\n")[0]  # level 2 not selected this time
    assert CampaignStore(tmp / "out").read_status().runs == 2


@pytest.mark.nvcc
def test_an_eval_in_another_track_is_its_own_key_and_its_own_folder(first_run) -> None:
    tmp, _ = first_run
    out = tmp / "tf32"
    proc = _eval(tmp, str(TREE), "--solutions", str(SOLUTIONS), "--level", "1", "--problems", "1",
                 "--compile-only", "--track", "tf32", "--out", str(out), "--build-jobs", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [record] = CampaignStore(out).initials().values()
    stored = record.final.record
    assert stored.track == Track.tf32 and stored.options == {"track": "tf32"}
    assert stored.strength.value == "compile_only"
    report = json.loads((out / "report" / "report.json").read_text())
    assert report["config"]["track"] == "tf32" and set(report["by_track"]) == {"tf32"}
    assert [p["track"] for p in report["problems"]] == ["tf32"]
    with KBStore.open(tmp / "kb.json").read() as kb:
        verdicts = kb.candidate_verdicts(record.candidate_id)
    # the fp32 verdict of the same solution (first run) and the tf32 one: two keys, neither replaced
    assert sorted(v.track.value for v in verdicts) == ["fp32", "tf32"]
    assert len({v.key for v in verdicts}) == 2
    # one folder never holds two tracks' results (a report would rank them together)
    again = _eval(tmp, str(TREE), "--solutions", str(SOLUTIONS), "--compile-only", "--track", "fp32", "--out", str(out))
    assert again.returncode == 1 and "holds results of the tf32 track" in again.stderr


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--problems", "7"], 1, "none with ids 7"),  # the caller's: what is selected is not there
        (["--solutions", "/no/such/dir"], 1, "solutions folder not found"),
        (["--level", "5"], 1, "has no level5 folder"),
        (["--problems", "7-1"], 2, "runs backwards"),  # the command line's: no run could use it
        (["--build-jobs", "-1"], 2, "--build-jobs takes 0 (no builds ahead) or more"),
    ],
)
def test_unusable_arguments_are_the_callers_to_fix(tmp_path: Path, args: list[str], status: int, message: str) -> None:
    proc = _eval(tmp_path, str(TREE), *args, "--out", str(tmp_path / "o"))
    assert proc.returncode == status and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", ["../x", "..", ".hidden"])
def test_an_eval_name_that_leaves_the_evals_folder_is_refused(tmp_path: Path, name: str) -> None:
    proc = subprocess.run(  # no --out: the folder comes from --name
        [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp_path / "kb.json"), "eval", str(TREE),
         "--solutions", str(SOLUTIONS), "--compile-only", "--no-progress", "--name", name],
        capture_output=True, text=True, env={**os.environ, "KB_MCP_HOME": str(tmp_path / "home")}, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # the command line's (docs/agents.md, "Exit statuses")
    assert f"{name!r} cannot name an eval" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in (tmp_path / "kb.artifacts").glob("*")) in ([], ["evals"])
    assert not list((tmp_path / "kb.artifacts").glob("*/campaign.json"))  # nothing written beside evals/


def test_cli_tracks_are_the_models_tracks() -> None:
    assert tuple(t.value for t in Track) == cmd_eval.TRACKS


@pytest.mark.gpu
def test_on_a_gpu_solutions_are_timed_against_both_baselines(tmp_path: Path) -> None:
    """The same tree on a GPU: valid solutions get times and speedups over eager, torch.compile and the better."""
    from kb_mcp.campaign.eval_models import EvalOptions
    from kb_mcp.campaign.evaluate import evaluate
    from kb_mcp.kb.models import Verdict
    from kb_mcp.tools.context import ToolContext

    ctx = ToolContext(tmp_path / "kb.json")
    try:
        result = evaluate(tmp_path / "out", ctx, EvalOptions(problems=[str(TREE)], solutions=str(SOLUTIONS)),
                          have_gpu=True)
    finally:
        ctx.close()
    lines = {line.problem: line for line in result.lines}
    assert lines["1_Scale_Add_ReLU"].verdict is Verdict.compile_error
    assert "baselines are timed only beside a solution" in lines["3_Square"].note
    problems = {p.problem: p for p in result.report.problems}
    for name in ("1_Scale", "2_Add_Bias"):
        assert lines[name].verdict in (Verdict.faster, Verdict.slower), lines[name]
        p = problems[name]
        assert p.eager_ms and p.best_ms and p.best_vs_eager == pytest.approx(p.eager_ms / p.best_ms)
        baseline = min(t for t in (p.eager_ms, p.compile_ms) if t is not None)
        assert p.best_speedup == pytest.approx(baseline / p.best_ms)
    assert result.report.valid_rate == 0.5 and result.report.speedup.n == 2
