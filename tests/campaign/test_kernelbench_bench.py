"""bench/kernelbench_bench.py as a real process, compile-only, on a KernelBench-format tree we wrote:
a `kb-mcp serve` on stdio driven through the tools an agent uses (suggest_optimizations,
compile_and_verify, record_outcome; no profile without a GPU, so the manifest's state), a failing
solution reported as the solution's fault while the run goes on, outcomes in the KB tagged with
the problem and the track, and the starter KB exported as one file that `kb-mcp kb import` takes.
Also the manifest shipped with the real solutions: every optimization and state it names is in
the seed KB, and every solution file it names exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kb_mcp.kb.models import Outcome, Track, Verdict
from kb_mcp.kb.store import KBStore

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "kernelbench_bench.py"
TREE = Path(__file__).resolve().parent / "kernelbench_tree"
SHIPPED = ROOT / "bench" / "kernelbench_solutions"


def _manifest(tmp: Path) -> Path:
    path = tmp / "manifest.json"
    path.write_text(json.dumps({"solutions": [
        {"problem": "level1/1_Scale.py", "solution": "1_Scale.py", "track": "tf32",
         "optimization_id": "fuse_elementwise_chain", "expected_state": "memory_bandwidth_saturated",
         "note": "One scaling kernel."},
        {"problem": "level2/1_Scale_Add_ReLU.py", "solution": "level2/1_Scale_Add_ReLU.py",
         "optimization_id": "fuse_elementwise_chain", "expected_state": "high_level_inefficiency"},
        {"problem": "level1/3_Square.py", "solution": "level1/no_such_file.py",
         "optimization_id": "fuse_elementwise_chain", "expected_state": "high_level_inefficiency"},
    ]}))
    return path


def _outcomes(kb: Path) -> list[Outcome]:
    with KBStore.open(kb, create=False).read() as view:
        return view.outcomes()


def _bench(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KB_MCP_HOME": str(tmp / "home")}
    cmd = [sys.executable, str(BENCH), str(TREE / "KernelBench"), "--solutions", str(TREE / "solutions"),
           "--manifest", str(_manifest(tmp)), "--compile-only", "--out", str(tmp / "out"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.nvcc
def test_the_tools_in_an_agents_order_compile_only(tmp_path: Path) -> None:
    starter = tmp_path / "starter" / "kb.json"
    proc = _bench(tmp_path, "--starter-kb", str(starter))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = {r["key"]: r for r in json.loads((tmp_path / "out" / "bench.json").read_text())["runs"]}
    scale, broken, missing = runs["level1/1"], runs["level2/1"], runs["level1/3"]
    assert scale["verdict"] == "needs_gpu" and scale["state_source"] == "manifest" and scale["recorded"]
    assert scale["state_id"] == "memory_bandwidth_saturated" and scale["suggestions"] and not scale["fault"]
    assert broken["verdict"] == "compile_error" and broken["fault"] == "solution" and broken["recorded"]
    assert missing["fault"] == "solution" and "no_such_file.py" in missing["note"] and missing["verdict"] is None
    assert "level2/1" in proc.stdout and "compile_error" in (tmp_path / "out" / "report.md").read_text()

    outcomes = _outcomes(tmp_path / "out" / "kb.json")
    tagged = {(o.problem, o.track, o.verdict) for o in outcomes}
    assert tagged == {("1_Scale", Track.tf32, Verdict.needs_gpu), ("1_Scale_Add_ReLU", Track.fp32,
                                                                   Verdict.compile_error)}
    assert all("KernelBench level" in o.analysis for o in outcomes)

    fresh = tmp_path / "fresh.json"
    env = {**os.environ, "KB_MCP_HOME": str(tmp_path / "home")}
    imported = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(fresh), "kb", "import",
                               str(starter)], capture_output=True, text=True, env=env, timeout=120)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert {o.problem for o in _outcomes(fresh)} == {"1_Scale", "1_Scale_Add_ReLU"}


def test_problems_selects_and_names_what_it_does_not_know(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "--problems", "level1/1,9_Nothing")
    assert proc.returncode != 0 and "9_Nothing" in proc.stderr and "level1/1" not in proc.stderr


def test_the_shipped_manifest_names_seed_ids_and_existing_files() -> None:
    seed = ROOT / "kb" / "seed"
    optimizations = {o["id"] for o in json.loads((seed / "optimizations.json").read_text())}
    states = {s["id"] for s in json.loads((seed / "states.json").read_text())}
    entries = json.loads((SHIPPED / "manifest.json").read_text())["solutions"]
    assert len(entries) >= 10
    for e in entries:
        assert e["optimization_id"] in optimizations and e["expected_state"] in states, e
        assert (SHIPPED / e["solution"]).is_file() and Path(e["solution"]).name == Path(e["problem"]).name, e
        assert e.get("track", "fp32") in {t.value for t in Track}
