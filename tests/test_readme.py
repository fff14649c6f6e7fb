"""The README's two set-up commands: CI runs the test one verbatim, and both stay one line each."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    section = ROOT.joinpath("README.md").read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_has_a_main_command_and_a_test_command() -> None:
    main, tests = _setup_commands()
    assert "\n" not in main and main.endswith("kb-mcp serve")
    assert "\n" not in tests and re.search(r"&& pytest( -n auto --dist loadfile)?$", tests), tests
    assert "pytest-xdist" in ROOT.joinpath("pyproject.toml").read_text()  # what `-n` needs is installed by it


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci_lines = ROOT.joinpath(".ci/run").read_text().splitlines()
    assert _setup_commands()[1] in ci_lines
