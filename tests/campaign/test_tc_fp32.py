"""The strict-fp32 tensor-core solutions (bench/kernelbench_solutions/fp32_tc) and their generator
bench/tc_fp32_sync.py: the shipped files are what the generator writes from the one GEMM core, a
drifted file is caught, each solution is one self-contained candidate file defining ModelNew, each
CUDA source compiles for sm_90a with no spills (nvcc), and on a GPU the core passes its unit test."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYNC = ROOT / "bench" / "tc_fp32_sync.py"
CHECK = ROOT / "bench" / "tc_fp32_check.py"
FOLDER = ROOT / "bench" / "kernelbench_solutions" / "fp32_tc"
MANIFEST = FOLDER / "manifest.json"


def _run(*argv: str | Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def _entries() -> list[dict[str, str]]:
    return list(json.loads(MANIFEST.read_text())["solutions"])


def test_the_shipped_solutions_are_what_the_generator_writes() -> None:
    proc = _run(SYNC, "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_catches_a_drifted_or_missing_file(tmp_path: Path) -> None:
    assert _run(SYNC, "--out", tmp_path).returncode == 0
    assert _run(SYNC, "--check", "--out", tmp_path).returncode == 0
    victim = tmp_path / "level2" / "12_Gemm_Multiply_LeakyReLU.py"
    victim.write_text(victim.read_text().replace("#define B_KN 0", "#define B_KN 1"))
    (tmp_path / "level1" / "17_Matmul_with_transposed_B.py").unlink()
    proc = _run(SYNC, "--check", "--out", tmp_path)
    assert proc.returncode == 1
    assert "12_Gemm_Multiply_LeakyReLU.py" in proc.stdout and "17_Matmul_with_transposed_B.py" in proc.stdout


def test_the_manifest_names_seed_ids_and_every_generated_file() -> None:
    seed = ROOT / "kb" / "seed"
    optimizations = {o["id"] for o in json.loads((seed / "optimizations.json").read_text())}
    states = {s["id"] for s in json.loads((seed / "states.json").read_text())}
    entries = _entries()
    assert {e["solution"] for e in entries} == {p.relative_to(FOLDER).as_posix() for p in FOLDER.rglob("*.py")}
    for e in entries:
        assert e["track"] == "fp32" and e["problem"] == e["solution"]
        assert e["optimization_id"] in optimizations and e["expected_state"] in states


def test_each_solution_is_one_self_contained_candidate() -> None:
    names = set()
    for e in _entries():
        tree = ast.parse((FOLDER / e["solution"]).read_text())
        classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        assert "ModelNew" in classes and "Model" not in classes, e["solution"]
        imports = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        assert imports <= {"torch", "torch.nn", "load_inline"}, imports  # nothing from another solution
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Constant) for t in n.targets if isinstance(t, ast.Name)}
        assert "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32" in consts["CUDA"]
        assert "torch" not in consts["CUDA"].split("// @epilogue")[0].lower().replace("pytorch", "")
        names.add(consts["_EXT_NAME"])
    assert len(names) == len(_entries())  # one extension name each: builds never collide


# The default builds A from registers (AREG) and, where B is N x K, copies tiles by TMA; these stage
# through the producer's registers instead, or copy 64-wide K tiles.
AREG_VARIANTS = "TMA=0;TMA=0,SWIZZLE=1;TMA=0,PREFETCH=0;TMA=0,STAGES=4"
TMA_VARIANTS = "TMA=1,BK=64;TMA=1,STAGES=3"
SHARED_A_VARIANTS = "AREG=0,TMA=0,FRESH_D=0;AREG=0,TMA=0,BK=16,STAGES=6"


def _compile_rows(tmp_path: Path, *argv: str) -> list[dict[str, object]]:
    out = tmp_path / "compile.json"
    proc = _run(CHECK, "--compile-only", *argv, "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return list(json.loads(out.read_text())["compile"])


def _assert_clean(row: dict[str, object]) -> None:
    assert row["ok"] and row["spill_bytes"] == 0 and row["warnings"] == [], row
    assert isinstance(row["smem_bytes"], int) and row["smem_bytes"] <= 227 * 1024, row
    registers = row["registers"]
    assert isinstance(registers, int) and registers <= 168, row
    if "AREG=0" not in str(row["variant"]):
        # setmaxnreg moves registers within the CTA's launch allocation, which the core takes to
        # be 384 x 168 (its static_assert): a kernel built with fewer would leave inc waiting
        assert registers == 168, row


@pytest.mark.nvcc
def test_each_solution_compiles_for_sm90a_without_spills(tmp_path: Path) -> None:
    variants = ";".join((SHARED_A_VARIANTS, AREG_VARIANTS, TMA_VARIANTS))
    rows = _compile_rows(tmp_path, "--variants", variants)
    assert len(rows) == len(_entries()) + len(variants.split(";"))
    assert str(rows[0]["solution"]).startswith("level1/17")  # the variants build B N x K
    for row in rows:
        _assert_clean(row)


@pytest.mark.nvcc
def test_the_register_a_variant_compiles_with_b_given_k_by_n(tmp_path: Path) -> None:
    rows = _compile_rows(tmp_path, "--problems", "level1/1", "--variants", AREG_VARIANTS)
    named = [",".join(sorted(v.split(","))) for v in AREG_VARIANTS.split(";")]  # the tool sorts the switches
    assert [r["variant"] for r in rows] == ["base", *named]
    for row in rows:
        _assert_clean(row)


@pytest.mark.nvcc
def test_tma_with_b_given_k_by_n_is_refused_at_compile_time(tmp_path: Path) -> None:
    # the copies cannot transpose: a build that asks for them anyway must say so, not run wrong
    out = tmp_path / "compile.json"
    proc = _run(CHECK, "--compile-only", "--problems", "level1/1", "--variants", "TMA=1", "--json", out)
    rows = json.loads(out.read_text())["compile"]
    assert [r["ok"] for r in rows] == [True, False], proc.stdout
    assert "TMA needs AREG 1, HI_IMPLICIT 1" in str(rows[1]["log"])


@pytest.mark.gpu
def test_the_core_passes_its_unit_test_on_the_gpu(tmp_path: Path) -> None:
    out = tmp_path / "unit.json"
    proc = _run(CHECK, "--unit-only", "--json", out, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = json.loads(out.read_text())["unit"]
    assert rows and all(r["ok"] for r in rows)
