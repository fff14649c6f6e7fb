"""Fixtures of the harness tests."""

from __future__ import annotations

import pytest
from harness_helpers import FIXTURES

from kb_mcp.harness.problem import Problem, load_problem


@pytest.fixture(scope="session")
def relu_problem() -> Problem:
    """A small ReLU problem."""
    return load_problem(FIXTURES / "relu_problem.py")
