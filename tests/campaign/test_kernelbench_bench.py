"""bench/kernelbench_bench.py as a real process, compile-only, on a KernelBench-format tree we wrote:
a `kb-mcp serve` on stdio driven through the tools an agent uses (suggest_optimizations,
compile_and_verify, record_outcome; no profile without a GPU, so the manifest's state), a failing
solution reported as the solution's fault while the run goes on, outcomes in the KB tagged with
the problem and the track, and the starter KB exported as one file that `kb-mcp kb import` takes.
Also the manifest shipped with the real solutions: every optimization and state it names is in
the seed KB, and every solution file it names exists. And, without a process, the precision
evidence a verdict carries (the probes' worst ratio and the scheme) kept in bench.json and the
report beside the unchanged table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kb_mcp.harness.judgment.probing import PrecisionCheck, ProbeError, Status
from kb_mcp.kb.models import Outcome, Track, Verdict
from kb_mcp.kb.store import KBStore

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "kernelbench_bench.py"
if str(BENCH.parent) not in sys.path:
    sys.path.insert(0, str(BENCH.parent))

import kernelbench_bench as kbb  # noqa: E402

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


def _probed(status: Status, ratios: dict[str, float | None]) -> dict[str, object]:
    """A `compile_and_verify` result's `precision` as the server sends it (JSON: inf as "Infinity")."""
    check = PrecisionCheck(track=Track.fp32, kernels={"gemm3x_kernel": ["tf32"]}, status=status,
                           probes=[ProbeError(probe=p, ratio=r, note="" if r is not None else "too large")
                                   for p, r in ratios.items()])
    return {"record": {}, "precision": json.loads(check.model_dump_json())}


def test_the_precision_evidence_names_the_worst_probe_and_the_scheme() -> None:
    passed = kbb.precision_evidence(_probed("passed", {"own": 0.21, "low_bits": None, "mixed_magnitudes": 0.26,
                                                        "same_sign": 0.18}))
    assert passed is not None and passed.status == "passed" and passed.precisions == ["tf32"]
    assert (passed.worst_probe, passed.worst_ratio, passed.bound) == ("mixed_magnitudes", 0.26, 32.0)
    assert passed.probes["low_bits"] is None and passed.probes["own"] == 0.21
    assert "3xTF32" in passed.scheme and "worst 0.26x" in passed.scheme

    plain = kbb.precision_evidence(_probed("failed", {"own": 410.0, "same_sign": float("inf")}))
    assert plain is not None and plain.worst_probe == "same_sign" and plain.worst_ratio == float("inf")
    assert "not finite" in plain.scheme

    pending = kbb.precision_evidence(_probed("pending", {}))
    assert pending is not None and pending.worst_ratio is None and "no probe ran" in pending.line()
    assert kbb.precision_evidence({"record": {}, "precision": None}) is None
    assert kbb.precision_evidence({"record": {}}) is None


def test_bench_json_and_the_report_carry_the_precision_evidence(tmp_path: Path) -> None:
    evidence = kbb.precision_evidence(_probed("passed", {"own": 0.21, "mixed_magnitudes": 0.26}))
    broken = kbb.precision_evidence(_probed("failed", {"own": float("inf")}))
    common = {"track": "fp32", "optimization_id": "compensated_fp32_tensor_cores", "state_id": "tensor_cores_idle"}
    runs = [
        kbb.ProblemRun(key="level1/17", problem="17_Matmul_with_transposed_B", verdict="faster", time_ms=1.171,
                       eager_ms=2.741, compile_ms=2.826, speedup_vs_baseline=2.3416, precision=evidence, **common),
        kbb.ProblemRun(key="level2/9", problem="9_Matmul_Subtract_Multiply_ReLU", verdict="incorrect",
                       fault="solution", note="incorrect (precision_lowered)", precision=broken, **common),
        kbb.ProblemRun(key="level1/19", problem="19_ReLU", verdict="faster", time_ms=1.0, eager_ms=2.0,
                       compile_ms=2.0, speedup_vs_baseline=2.0, **common),
    ]
    budget = kbb.Budget(100.0, 10.0, 10.0)
    text = kbb.write_outputs(tmp_path, runs, "NVIDIA H200", budget, tmp_path / "kb.json", compile_only=False)

    rows = {r["key"]: r for r in json.loads((tmp_path / "bench.json").read_text())["runs"]}
    assert rows["level1/17"]["precision"]["worst_probe"] == "mixed_magnitudes"
    assert rows["level1/17"]["precision"]["worst_ratio"] == 0.26
    assert "3xTF32" in rows["level1/17"]["precision"]["scheme"]
    assert rows["level2/9"]["precision"]["worst_ratio"] == "Infinity"  # strict JSON: no bare Infinity token
    assert rows["level1/19"]["precision"] is None
    assert rows["level1/17"]["speedup_vs_eager"] == pytest.approx(2.741 / 1.171)  # the old fields stay

    report = (tmp_path / "report.md").read_text()
    assert text in report
    table_rows = [line for line in text.splitlines() if line.startswith(("level1/", "level2/"))]
    assert [line.split()[0] for line in table_rows[:3]] == ["level1/17", "level2/9", "level1/19"]
    assert "2.342x" in table_rows[0] and "precision" not in table_rows[0]  # the table's columns are unchanged
    assert "precision probes" in text
    evidence_lines = {line.split()[0]: line for line in table_rows[3:]}
    assert set(evidence_lines) == {"level1/17", "level2/9"}
    assert "passed, worst probe mixed_magnitudes: " in evidence_lines["level1/17"]
    assert "(worst 0.26x, bound 32x): an error-compensated scheme such as 3xTF32" in evidence_lines["level1/17"]
    assert "failed, worst probe own: " in evidence_lines["level2/9"] and "not finite" in evidence_lines["level2/9"]
