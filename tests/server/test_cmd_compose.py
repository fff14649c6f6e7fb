"""`kb-mcp compose`, run as a user runs it: the operator's own parts folder (the one `kb-mcp decompose
--out` wrote, anywhere) is theirs to name, unlike an MCP caller's `out_dir`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

STEPS = Path(__file__).parents[1] / "decomposition" / "steps_model.py"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", *args], capture_output=True, text=True,
                          timeout=600)


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
