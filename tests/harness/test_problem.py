"""harness/problem.py: a problem file is read within the size limit, on every path that loads one."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from kb_mcp.harness.problem import MAX_SOURCE_BYTES, ProblemError, load_problem

PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16)]


def get_init_inputs():
    return []
'''


def test_a_problem_file_within_the_limit_loads(tmp_path: Path) -> None:
    path = tmp_path / "relu.py"
    path.write_text(PROBLEM + "#" * (MAX_SOURCE_BYTES - len(PROBLEM) - 1) + "\n")
    assert path.stat().st_size == MAX_SOURCE_BYTES
    problem = load_problem(path)
    assert problem.name == "relu" and problem.source.startswith("import torch")


def test_a_problem_file_over_the_limit_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "relu.py"
    path.write_text(PROBLEM + "#" * (MAX_SOURCE_BYTES - len(PROBLEM)) + "\n")
    with pytest.raises(ProblemError, match=rf"{path}: more than {MAX_SOURCE_BYTES} bytes, over the 1 MiB"):
        load_problem(path)


def test_a_huge_problem_file_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "huge.py"
    with path.open("wb") as f:
        f.write(PROBLEM.encode())
        f.truncate(8 << 30)  # 8 GiB, sparse: reading it whole would take 8 GiB of memory
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ProblemError, match="more than"):
        load_problem(path)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 << 10, f"peak memory grew by {grown_kib} KiB"


def test_a_problem_file_that_is_not_utf8_is_a_problem_error(tmp_path: Path) -> None:
    path = tmp_path / "latin.py"
    path.write_bytes(PROBLEM.encode() + b"# caf\xe9\n")
    with pytest.raises(ProblemError, match=r"not UTF-8 text \(byte 0xe9 at offset"):
        load_problem(path)
