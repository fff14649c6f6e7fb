"""`kb-mcp decompose`, run as a user runs it: the parts written, the ranking by file, and a layer that
runs in several files (an output layer over an input's steps) listed once with all its places."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

STEPS = Path(__file__).parents[1] / "decomposition" / "steps_model.py"
ENDLESS = Path(__file__).parents[1] / "decomposition" / "endless_model.py"


def test_the_listing_ranks_the_files_and_names_a_layer_spread_over_several(tmp_path: Path) -> None:
    problem = tmp_path / "toy_steps.py"
    problem.write_text(STEPS.read_text())
    out = tmp_path / "parts"
    proc = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "decompose", str(problem), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (out / "decomposition.json").is_file() and (out / "composed_reference.py").is_file()
    said = proc.stderr.splitlines()  # progress on stderr: what it traces, under which limit, how long it took
    assert said[0] == "kb-mcp decompose: tracing toy_steps in the sandbox (time limit 180 s)...", proc.stderr
    assert said[1].startswith("kb-mcp decompose: traced and split toy_steps in ") and said[1].endswith(" s")
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


def test_a_model_that_never_finishes_building_is_stopped_at_the_timeout_and_named_as_the_cause(
        tmp_path: Path) -> None:
    problem = tmp_path / "endless.py"
    problem.write_text(ENDLESS.read_text())
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "decompose", str(problem), "--out",
                           str(tmp_path / "parts"), "--timeout", "4"], capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < 60, "stopped at its own limit, not the sandbox's 15 minutes"
    assert proc.returncode == 1, proc.stderr  # the problem's fault, as for a model that does not build
    said = proc.stderr.splitlines()
    assert said[0] == "kb-mcp decompose: tracing endless in the sandbox (time limit 4 s)..."
    error = said[-1]
    assert error.startswith(f"kb-mcp decompose: the problem {problem} could not be decomposed: tracing endless "
                            "failed: the problem's own code (its file's top level, its Model's construction or its "
                            "forward, run while it is traced in the sandbox) ran past the time limit of 4 s"), error
    assert "raise the limit (up to 3600 s): `--timeout SECONDS` for kb-mcp decompose" in error
    assert "Traceback" not in proc.stderr and "exit -9" not in proc.stderr
    assert not (tmp_path / "parts").exists()


def test_a_timeout_outside_its_range_is_refused_before_anything_runs(tmp_path: Path) -> None:
    problem = tmp_path / "endless.py"
    problem.write_text(ENDLESS.read_text())
    for value, said in (("0", "must be 1 to 3600 seconds, not 0"), ("7200", "must be 1 to 3600 seconds, not 7200"),
                        ("nan", "not nan"), ("soon", "not a number of seconds: 'soon'")):
        proc = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "decompose", str(problem), "--timeout",
                               value], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert proc.returncode == 2 and said in proc.stderr.split("argument --timeout: ")[-1], (value, proc.stderr)
        assert "tracing" not in proc.stderr


def test_a_model_the_trace_cannot_split_faithfully_is_refused_as_kb_mcps_not_the_problems(tmp_path: Path) -> None:
    """No part is written with zeros for a tensor the forward derived from a buffer: exit 4 (ours), the
    reason and the way around it, no traceback."""
    problem = tmp_path / "derived.py"
    problem.write_text((Path(__file__).parents[1] / "decomposition" / "derived_buffer_model.py").read_text())
    out = tmp_path / "parts"
    proc = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "decompose", str(problem), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith(f"kb-mcp decompose: the problem {problem} could not be decomposed: part01 reads a tensor")
    assert "not a fault of the model" in error and "register it as a buffer" in error
    assert "Traceback" not in proc.stderr and not out.exists()
