"""Fixture paths and loaders shared by the profiling tests (a plain module: a uniquely named import,
unlike `conftest`, cannot pick up another folder's helpers)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from kb_mcp.harness.profile_model import Profile
from kb_mcp.profiling.ncu_parse import parse_ncu_csv

ROOT = Path(__file__).resolve().parents[2]
OWN = ROOT / "tests" / "fixtures" / "ncu"
SHARED = OWN / "shared"  # the team's reference recordings (H100), trimmed
PROBLEMS = Path(__file__).resolve().parent / "problems"


def own_profile(name: str) -> Profile:
    """A Profile parsed from one of our recorded planted-kernel fixtures."""
    raw = (OWN / f"{name}.raw.csv").read_text()
    details = (OWN / f"{name}.details.csv").read_text()
    return Profile(profile_id="p_0000000000aa", problem=name, kernels=parse_ncu_csv(raw, details))


def shared_file(name: str) -> Path:
    """A file of the team's shared reference ncu recordings (kept in the repository)."""
    path = SHARED / name
    assert path.is_file(), f"missing fixture {path}"
    return path


def pass_through_ncu(folder: Path) -> Path:
    """An `ncu` in `folder` that runs its target without profiling (the profiler's own logic is under
    test): point KB_MCP_NCU at it."""
    script = folder / "ncu"
    script.write_text(
        f"#!{sys.executable}\nimport os, sys\nargs = sys.argv[1:]\n"
        f"i = args.index({sys.executable!r})\nos.execv(args[i], args[i:])\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script
