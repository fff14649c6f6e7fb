"""`kb-mcp decompose`, run as a user runs it: the parts written, the ranking by file, and a layer that
runs in several files (an output layer over an input's steps) listed once with all its places."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

STEPS = Path(__file__).parents[1] / "decomposition" / "steps_model.py"


def test_the_listing_ranks_the_files_and_names_a_layer_spread_over_several(tmp_path: Path) -> None:
    problem = tmp_path / "toy_steps.py"
    problem.write_text(STEPS.read_text())
    out = tmp_path / "parts"
    proc = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "decompose", str(problem), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (out / "decomposition.json").is_file() and (out / "composed_reference.py").is_file()
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("toy_steps: ") and "parts in" in lines[0] and f"written to {out}" in lines[0]
    at = lines.index("  layers that run in several files (their places differ, e.g. in the piece of an input "
                     "they take):")
    # the output layer: a step's piece of x in each of its parts, so five files for its five places
    layer = [line for line in lines[at + 1:] if "at 5 places in 5 files" in line]
    assert len(layer) == 1 and "gemm" in layer[0] and "linear" in layer[0].lower(), proc.stdout


def test_a_file_that_is_not_a_problem_gets_the_tools_own_words(tmp_path: Path) -> None:
    # the same check compose and the MCP tool make first, before anything is traced
    cases = {"bad.py": ("class Model:\n    def f(\n", "syntax error at line 2"),
             "no_model.py": ("import torch\nx = 1\n", "not a KernelBench problem, missing top-level Model")}
    for name, (text, said) in cases.items():
        problem = tmp_path / name
        problem.write_text(text)
        proc = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "decompose", str(problem), "--out",
                               str(tmp_path / "parts")], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith(f"kb-mcp decompose: {problem}: {said}")
        assert "tracing" not in proc.stderr and "Error" not in proc.stderr
    assert not (tmp_path / "parts").exists()
