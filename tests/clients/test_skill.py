"""The Claude Code Skill: shipped in the package, its front matter in the Skill format, naming the
tools the server really has, and installed by `kb-mcp install-skill` without clobbering edits."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

from kb_mcp.server.cmd_skill import SKILL_NAME, skill_text
from kb_mcp.server.job_tools import server_specs
from kb_mcp.server.registry import load_tools
from kb_mcp.tools.context import ToolContext

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SKILL = ROOT / "clients" / "skills" / SKILL_NAME / "SKILL.md"


def _front_matter(text: str) -> dict[str, str]:
    match = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert match, "SKILL.md starts with a --- front matter block ---"
    fields = {}
    for line in match.group(1).splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def test_front_matter_is_a_valid_skill_header() -> None:
    meta = _front_matter(SKILL.read_text())
    assert meta["name"] == SKILL_NAME == SKILL.parent.name
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", meta["name"]) and len(meta["name"]) <= 64
    assert 50 < len(meta["description"]) <= 1024 and "Use when" in meta["description"]


def test_the_skill_teaches_the_tools_the_server_has(tmp_path: Path) -> None:
    text = SKILL.read_text()
    for spec in load_tools():
        assert f"`{spec.name}" in text, spec.name
    _, served = server_specs(ToolContext(tmp_path / "kb.json"))  # the job tools too: every tool it lists
    assert {spec.name for spec in served if f"`{spec.name}`" not in text} == set()
    assert "needs_gpu" in text
    assert "`record`, with the `candidate_id`" in " ".join(text.split())  # where compile_and_verify returns it


def test_it_ships_in_the_package() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["kb_mcp.clients"]
    relative = SKILL.relative_to(ROOT / "clients").as_posix()
    assert any(fnmatch(relative, pattern) for pattern in data)
    for config in (ROOT / "clients" / "configs").iterdir():
        assert any(fnmatch(f"configs/{config.name}", pattern) for pattern in data), config.name
    assert skill_text() == SKILL.read_text()  # what the installed package reads


def _install(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "install-skill", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(home)})


def test_install_places_it_where_claude_code_looks_and_keeps_edits(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    personal = home / ".claude" / "skills" / SKILL_NAME / "SKILL.md"
    assert _install(cwd=project, home=home).returncode == 0
    assert personal.read_text() == SKILL.read_text()
    assert "already installed" in _install(cwd=project, home=home).stdout
    personal.write_text(SKILL.read_text() + "\nmy own note\n")
    refused = _install(cwd=project, home=home)
    assert refused.returncode == 1 and "--force" in refused.stderr and "my own note" in personal.read_text()
    assert _install("--force", cwd=project, home=home).returncode == 0 and "my own note" not in personal.read_text()
    assert _install("--project", cwd=project, home=home).returncode == 0
    assert (project / ".claude" / "skills" / SKILL_NAME / "SKILL.md").is_file()
    assert _install("--dir", str(tmp_path / "elsewhere"), cwd=project, home=home).returncode == 0
    assert (tmp_path / "elsewhere" / SKILL_NAME / "SKILL.md").is_file()


def test_a_dir_that_is_a_file_is_refused_naming_it_and_the_file_is_kept(tmp_path: Path) -> None:
    taken = tmp_path / "notes.txt"
    taken.write_text("mine\n")
    done = _install("--dir", str(taken), cwd=tmp_path, home=tmp_path)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot install the Skill at {taken / SKILL_NAME / 'SKILL.md'}: Not a directory" in done.stderr
    assert taken.read_text() == "mine\n"
