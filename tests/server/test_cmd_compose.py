"""`kb-mcp compose` and `kb-mcp decompose`, run as a user runs them: the operator's own parts folder (the
one `kb-mcp decompose --out` wrote, anywhere) is theirs to name, unlike an MCP caller's `out_dir`; a
folder that holds another model's decomposition is refused and left as it was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBLEMS = Path(__file__).parents[2] / "examples" / "problems"
STEPS = Path(__file__).parents[1] / "decomposition" / "steps_model.py"
ENDLESS = Path(__file__).parents[1] / "decomposition" / "endless_model.py"
CLI = [sys.executable, "-m", "kb_mcp.server.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_compose_writes_the_candidate_in_the_operators_own_parts_folder(tmp_path: Path) -> None:
    problem = tmp_path / "toy_steps.py"
    problem.write_text(STEPS.read_text())
    out = tmp_path / "workspace" / "toy_steps-parts"  # outside the KB's folder for decompositions
    assert _cli("decompose", str(problem), "--out", str(out)).returncode == 0
    proc = _cli("--kb", str(tmp_path / "kb.json"), "compose", str(problem), "--parts", str(out), "--no-verify")
    assert proc.returncode == 0, proc.stderr
    assert f"written to {out / 'composed.py'}" in proc.stdout
    assert "class ModelNew" in (out / "composed.py").read_text()
    assert not (tmp_path / "kb.artifacts" / "decompositions").exists()


def test_a_folder_holding_another_models_decomposition_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    parts = tmp_path / "mlp-parts"
    made = _cli("decompose", str(PROBLEMS / "mlp.py"), "--out", str(parts))
    assert made.returncode == 0, made.stderr
    before = _files(parts)
    assert "decomposition.json" in before and any(name.startswith("parts/") for name in before)
    other = PROBLEMS / "gemm.py"
    for argv in (["--kb", str(tmp_path / "kb.json"), "compose", str(other), "--parts", str(parts), "--no-verify"],
                 ["decompose", str(other), "--out", str(parts)]):
        refused = _cli(*argv)
        assert refused.returncode == 1, refused.stderr
        assert f"{parts} holds the decomposition of another problem, 'mlp'" in refused.stderr
        assert "Name another folder for the parts of 'gemm', or move" in refused.stderr
        assert _files(parts) == before


def test_compose_that_decomposes_first_stops_a_model_that_never_builds_at_its_timeout(tmp_path: Path) -> None:
    problem = tmp_path / "endless.py"
    problem.write_text(ENDLESS.read_text())
    parts = tmp_path / "endless-parts"
    proc = _cli("--kb", str(tmp_path / "kb.json"), "compose", str(problem), "--parts", str(parts), "--no-verify",
                "--timeout", "3")
    assert proc.returncode == 1, proc.stderr
    assert "kb-mcp compose: tracing endless in the sandbox (time limit 3 s)..." in proc.stderr.splitlines()
    error = proc.stderr.splitlines()[-1]
    assert error.startswith("kb-mcp compose: the problem ") and "ran past the time limit of 3 s" in error, error
    assert "`--timeout SECONDS` for kb-mcp decompose and kb-mcp compose" in error
    assert not parts.exists()
