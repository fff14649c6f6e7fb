"""`kb-mcp compose`, run as a user runs it, on a folder that holds another model's decomposition: refused,
the folder left as it was (and `kb-mcp decompose` refuses it alike)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBLEMS = Path(__file__).parents[2] / "examples" / "problems"
CLI = [sys.executable, "-m", "kb_mcp.server.cli"]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_folder_holding_another_models_decomposition_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    parts = tmp_path / "mlp-parts"
    made = subprocess.run([*CLI, "decompose", str(PROBLEMS / "mlp.py"), "--out", str(parts)],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    before = _files(parts)
    assert "decomposition.json" in before and any(name.startswith("parts/") for name in before)
    other = PROBLEMS / "gemm.py"
    for argv in (["--kb", str(tmp_path / "kb.json"), "compose", str(other), "--parts", str(parts), "--no-verify"],
                 ["decompose", str(other), "--out", str(parts)]):
        refused = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=600)
        assert refused.returncode == 1, refused.stderr
        assert f"{parts} holds the decomposition of another problem, 'mlp'" in refused.stderr
        assert "Name another folder for the parts of 'gemm', or move" in refused.stderr
        assert _files(parts) == before
