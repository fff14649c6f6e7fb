"""bench/eval_pipeline_bench.py as a real process, compile-only, on the KernelBench-format tree of the
campaign tests: both evals run (each in folders of its own), their verdicts agree, and the numbers it
prints are the ones it writes. Also the ten solutions it ships: one per level-2 problem, each a
load_inline candidate whose build a build ahead can read for certain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kb_mcp.harness.candidate import inline_units_ahead, parse_candidate, static_units
from kb_mcp.harness.toolchain import light_variants

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "eval_pipeline_bench.py"
TREE = Path(__file__).resolve().parent / "kernelbench_tree"
SHIPPED = ROOT / "bench" / "eval_pipeline_solutions" / "level2"


@pytest.mark.nvcc
def test_the_bench_runs_both_evals_and_their_verdicts_agree(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(BENCH), str(TREE), "--solutions", str(TREE / "solutions"),
                           "--level", "1", "--problems", "1-3", "--compile-only", "--build-jobs", "2",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdicts agree: yes" in proc.stdout and "(no GPU: not meaningful)" in proc.stdout
    data = json.loads((tmp_path / "eval_pipeline.json").read_text())
    assert data["order"] == ["pipelined", "serial"]
    serial, piped = data["runs"]["serial"], data["runs"]["pipelined"]
    assert serial["build_jobs"] == 0 and piped["build_jobs"] == 2
    assert [p["verdict"] for p in piped["problems"]] == ["needs_gpu", "needs_gpu", None]
    assert [p["verdict"] for p in serial["problems"]] == ["needs_gpu", "needs_gpu", None]
    summary = data["summary"]
    assert summary["verdicts_agree"] and summary["meaningful"] is False and summary["met"] is None
    assert summary["pipelined_wall_s"] == piped["wall_s"] > 0 and summary["serial_wall_s"] == serial["wall_s"] > 0
    assert piped["gpu_s"] == pytest.approx(sum(p.get("verify_s", 0) for p in piped["problems"]), abs=0.01)
    # each run had a cache of its own, so both started cold
    assert (tmp_path / "serial" / "cache").is_dir() and (tmp_path / "pipelined" / "cache").is_dir()
    assert f"wall: serial {serial['wall_s']:.1f} s, pipelined {piped['wall_s']:.1f} s" in proc.stdout


def test_the_shipped_solutions_are_ten_level2_load_inline_candidates_built_ahead() -> None:
    files = sorted(SHIPPED.glob("*.py"))
    assert len(files) == 10
    problems = ROOT.parent / "shared" / "kernelbench" / "level2"
    for f in files:
        source = f.read_text()
        parse_candidate(source, f.name)
        assert [u.kind for u in static_units(source)] == ["load_inline"], f.name
        [unit] = inline_units_ahead(source)
        # torch/extension.h on the C++ side (load_inline prepends it), none in the CUDA source
        assert unit.functions == ["forward"] and unit.implicit_headers, f.name
        assert light_variants(unit) == [True, False] and "#include <torch" not in unit.cuda_source, f.name
        if problems.is_dir():  # the KernelBench checkout beside this one, where it is
            assert (problems / f.name).is_file(), f"{f.name} names no level-2 problem"
