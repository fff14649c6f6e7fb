"""Fixture paths and loaders shared by the profiling tests (a plain module: a uniquely named import,
unlike `conftest`, cannot pick up another folder's helpers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.harness.ncu_parse import parse_ncu_csv
from kb_mcp.harness.profile_model import Profile

ROOT = Path(__file__).resolve().parents[2]
OWN = ROOT / "tests" / "fixtures" / "ncu"
SHARED = ROOT.parent / "shared" / "fixtures" / "ncu"
PROBLEMS = Path(__file__).resolve().parent / "problems"


def own_profile(name: str) -> Profile:
    """A Profile parsed from one of our recorded planted-kernel fixtures."""
    raw = (OWN / f"{name}.raw.csv").read_text()
    details = (OWN / f"{name}.details.csv").read_text()
    return Profile(profile_id="p_0000000000aa", problem=name, kernels=parse_ncu_csv(raw, details))


def shared_file(name: str) -> Path:
    """A file of the team's shared ncu fixtures; skips the test where that folder is absent."""
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"shared fixture {path} not present in this checkout")
    return path
