"""bench/eval_pipeline_bench.py as a real process, compile-only, on the KernelBench-format tree of the
campaign tests: both evals run (each in folders of its own), their verdicts agree, and the numbers it
prints are the ones it writes; one run at a time (`--only`) and the calls' results combined; baselines
seeded from a folder into each run's fresh cache (some left out); `--only baselines` without a GPU
says needs_gpu. Also the ten solutions it ships: one per level-2 problem, each a load_inline candidate
whose build a build ahead can read for certain."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kb_mcp.harness.baselines import Baseline, BaselineCache
from kb_mcp.harness.builds.toolchain import light_variants
from kb_mcp.harness.candidate import inline_units_ahead, parse_candidate, static_units
from kb_mcp.harness.problem import load_problem

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "eval_pipeline_bench.py"
TREE = Path(__file__).resolve().parent / "kernelbench_tree"
SHIPPED = ROOT / "bench" / "eval_pipeline_solutions" / "level2"
SMALL = [str(TREE), "--solutions", str(TREE / "solutions"), "--level", "1", "--build-jobs", "2"]


def _bench(*args: str, problems: str = "1-3") -> subprocess.CompletedProcess[str]:
    """The bench over the tree's level-1 problems (compile-only unless the arguments say otherwise)."""
    head = [*SMALL, "--problems", problems] if "--combine" not in args else []
    return subprocess.run([sys.executable, str(BENCH), *head, *args], capture_output=True, text=True, timeout=900)


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
    assert piped["baselines_gpu_s"] == 0 and piped["verify_gpu_s"] == piped["gpu_s"]  # no GPU: no baselines
    assert [p["baseline"] for p in piped["problems"]] == ["-", "-", "-"] and piped["seeded"] == []
    # each run had a cache of its own, so both started cold
    assert (tmp_path / "serial" / "cache").is_dir() and (tmp_path / "pipelined" / "cache").is_dir()
    assert f"pipelined: wall {piped['wall_s']:.1f} s; GPU time {piped['gpu_s']:.1f} s" in proc.stdout
    assert f"serial: wall {serial['wall_s']:.1f} s; GPU time {serial['gpu_s']:.1f} s" in proc.stdout


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


@pytest.mark.nvcc
def test_one_run_per_call_and_the_calls_combined(tmp_path: Path) -> None:
    """The pipelined run in one call, the serial one in two (a part of the problems each): combined, the
    serial run is the sum of its parts and the verdicts are compared over all problems; parts that
    overlap are refused."""
    piped = _bench("--compile-only", "--only", "pipelined", "--out", str(tmp_path / "p"))
    first = _bench("--compile-only", "--only", "serial", "--out", str(tmp_path / "s1"), problems="1")
    rest = _bench("--compile-only", "--only", "serial", "--out", str(tmp_path / "s2"), problems="2-3")
    for proc in (piped, first, rest):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdicts agree" not in piped.stdout and "pipelined wall / GPU time" in piped.stdout
    data = json.loads((tmp_path / "p" / "eval_pipeline.json").read_text())
    assert data["order"] == ["pipelined"] and list(data["runs"]) == ["pipelined"]
    parts = [json.loads((tmp_path / f / "eval_pipeline.json").read_text())["runs"]["serial"] for f in ("s1", "s2")]
    assert [len(p["problems"]) for p in parts] == [1, 2]
    files = [str(tmp_path / f / "eval_pipeline.json") for f in ("p", "s1", "s2")]
    combined = _bench("--combine", *files, "--out", str(tmp_path / "all"))
    assert combined.returncode == 0, combined.stdout + combined.stderr
    assert "verdicts agree: yes (3/3 the very same word" in combined.stdout
    assert "serial (the sum of 2 calls)" in combined.stdout
    result = json.loads((tmp_path / "all" / "eval_pipeline.json").read_text())
    serial = result["runs"]["serial"]
    assert serial["parts"] == 2 and serial["wall_s"] == pytest.approx(sum(p["wall_s"] for p in parts), abs=0.01)
    assert [p["problem"] for p in serial["problems"]] == ["1_Scale", "2_Add_Bias", "3_Square"]
    assert result["summary"]["verdicts_agree"] and result["summary"]["serial_parts"] == 2
    twice = _bench("--combine", files[1], files[1])
    assert twice.returncode != 0 and "serial runs overlap (1_Scale)" in twice.stderr


def _baseline(problem: str, device: str = "NVIDIA H200") -> Baseline:
    hash_ = load_problem(TREE / "KernelBench" / "level1" / f"{problem}.py").hash
    return Baseline(problem_hash=hash_, device=device, torch_version="2.11.0+cu130", eager_ms=1.0, eager_runs=10,
                    compile_ms=0.5, compile_runs=10)


@pytest.mark.nvcc
def test_baselines_from_a_folder_are_copied_into_each_fresh_cache_but_those_left_out(tmp_path: Path) -> None:
    source = tmp_path / "baselines"
    for name in ("1_Scale", "2_Add_Bias"):
        BaselineCache(tmp_path / "timed").put(_baseline(name))
    shutil.copytree(tmp_path / "timed" / "baselines", source, ignore=shutil.ignore_patterns("*.lock"))
    (source / "index.json").write_text("[]\n")  # beside the files, as --only baselines writes it
    proc = _bench("--compile-only", "--only", "pipelined", "--baselines-cache", str(source), "--uncached", "2",
                  "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    scale = BaselineCache(tmp_path / "x").path(_baseline("1_Scale").problem_hash, "NVIDIA H200", "2.11.0+cu130").name
    copied = sorted(p.name for p in (tmp_path / "run" / "pipelined" / "cache" / "baselines").glob("*.json"))
    assert copied == [scale]  # 2_Add_Bias's was left out, index.json is no baseline
    assert f"1 baseline file(s) copied from {source} into its fresh cache (left out: 2_Add_Bias)" in proc.stderr
    assert "no GPU: no baselines are timed or used" in proc.stderr  # none of this machine's GPU: none used
    refused = _bench("--compile-only", "--uncached", "2", "--out", str(tmp_path / "no"))
    assert refused.returncode == 2 and "--uncached leaves baselines out of --baselines-cache" in refused.stderr


@pytest.mark.nvcc
def test_only_baselines_without_a_gpu_says_needs_gpu(tmp_path: Path) -> None:
    proc = _bench("--compile-only", "--only", "baselines", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "needs_gpu: --compile-only: baselines are timed on a GPU only" in proc.stdout
    rows = json.loads((tmp_path / "eval_pipeline.json").read_text())["baselines"]["rows"]
    assert [(r["problem"], r["status"]) for r in rows] == [("1_Scale", "needs_gpu"), ("2_Add_Bias", "needs_gpu")]
    assert not (tmp_path / "baselines").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU here times the baselines")
def test_only_baselines_on_a_machine_without_a_gpu_starts_a_worker_that_says_needs_gpu(tmp_path: Path) -> None:
    proc = _bench("--only", "baselines", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "needs_gpu: no CUDA GPU in the worker" in proc.stdout
    assert "nothing to seed a run with" in proc.stdout and not list((tmp_path / "baselines").glob("*.json"))


@pytest.mark.gpu
def test_on_a_gpu_the_baselines_call_seeds_the_runs_of_the_next(tmp_path: Path) -> None:
    """`--only baselines` writes the cache files and index.json; a run given them finds every baseline
    cached (from the folder) but those left out, which the pipelined run times ahead or in a verification."""
    timed = _bench("--only", "baselines", "--out", str(tmp_path / "b"))
    assert timed.returncode == 0, timed.stdout + timed.stderr
    index = json.loads((tmp_path / "b" / "baselines" / "index.json").read_text())
    assert sorted(e["problem"] for e in index) == ["1_Scale", "2_Add_Bias"]
    run = _bench("--baselines-cache", str(tmp_path / "b" / "baselines"), "--uncached", "1", "--out",
                 str(tmp_path / "r"))
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads((tmp_path / "r" / "eval_pipeline.json").read_text())
    for mode in ("pipelined", "serial"):
        rows = {p["problem"]: p for p in data["runs"][mode]["problems"]}
        assert data["runs"][mode]["seeded"] == ["2_Add_Bias"]
        assert rows["2_Add_Bias"]["baseline"] == "cache" and rows["2_Add_Bias"]["baseline_cached"] is True
        assert rows["1_Scale"]["baseline"] in ("ahead", "verification")
    assert "baselines from the cache for" in run.stderr and "not cached, timed by this run: 1_Scale" in run.stderr
