"""The `kb-mcp` entry point: lazy command modules, `--version`, and what start-up imports.

Start-up time itself is measured by bench/startup_bench.py; here we check its cause: `--help` and
the `kb` commands import none of the heavy packages.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kb_mcp.server import cli, stdout
from kb_mcp.server.about import DIST_NAME

HEAVY = ("openai", "torch", "mcp", "matplotlib", "uvicorn", "starlette")

_PROBE = """
import json, sys
from kb_mcp.server.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps(sorted(m for m in {watched!r} if m in sys.modules)), file=sys.stderr)
"""


def _imports(args: list[str], kb: Path, watched: tuple[str, ...] = HEAVY) -> list[str]:
    """Which of `watched` a fresh `kb-mcp --kb KB ARGS` process imported by the time it finished."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(watched=watched), "--kb", str(kb), *args],
        capture_output=True, text=True, timeout=120,
    )
    return json.loads(out.stderr.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def seeded_kb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kb = tmp_path_factory.mktemp("kb") / "kb.json"
    assert cli.main(["--kb", str(kb), "kb", "init"]) == 0
    return kb


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--version"], ["kb", "--help"], ["kb", "stats"], ["kb", "stats", "--json"], ["kb", "states"],
     ["doctor", "--json"], ["call", "--list"]],
)
def test_start_up_imports_nothing_heavy(args: list[str], seeded_kb: Path) -> None:
    assert _imports(args, seeded_kb) == []


# What each `kb` action needs, and what it must not pay for (bench/startup_bench.py has the times).
KB_LAYERS = ("pydantic", "rich.console", "kb_mcp.kb.store", "kb_mcp.kb.interchange", "kb_mcp.policy.update",
             "kb_mcp.server.jobs", "kb_mcp.server.kb_views", "kb_mcp.kb.lifecycle")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--help"], []),
        (["kb", "--help"], ["pydantic"]),  # the --verdict choices of `kb candidates` come from kb.models
        (["kb", "stats", "--json"], ["kb_mcp.kb.store", "pydantic"]),
        (["kb", "stats"], ["kb_mcp.kb.store", "pydantic", "rich.console"]),
        (["kb", "states", "--json"], ["kb_mcp.kb.store", "kb_mcp.server.kb_views", "pydantic"]),
    ],
)
def test_each_kb_action_imports_only_what_it_needs(args: list[str], expected: list[str], seeded_kb: Path) -> None:
    assert _imports(args, seeded_kb, KB_LAYERS) == expected


def test_a_tool_call_is_the_command_that_imports_the_sdk(seeded_kb: Path) -> None:
    # `call --list` reads the tools' declarations; calling one builds the server (and its SDK)
    assert "mcp" in _imports(["call", "suggest_optimizations", "--arg", "state_id=hybrid_bound"], seeded_kb)


def test_version_names_the_distribution() -> None:
    out = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    assert out.stdout.startswith("kb-mcp ") and DIST_NAME in out.stdout and "not installed" not in out.stdout


def test_each_commands_listed_help_is_its_own() -> None:
    full = cli.build_parser()
    sub = next(a for a in full._actions if a.dest == "command")
    registered = {c.dest: c.help for c in sub._choices_actions}
    assert registered == {name: help_text for name, (_module, help_text) in cli.COMMANDS.items()}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["serve"], "serve"), (["--kb", "serve", "kb", "stats"], "kb"), (["--kb=x", "call"], "call"), (["--help"], None),
     (["nope"], None)],
)
def test_the_chosen_command_is_found_past_global_options(argv: list[str], expected: str | None) -> None:
    assert cli.chosen_command(argv) == expected


def test_an_unknown_command_is_refused_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["frobnicate"])
    assert exc.value.code == 2
    assert "run-campaign" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [["kb", "states", "--json"], ["kb", "states"], ["kb", "stats"],
     ["call", "suggest_optimizations", "--arg", "state_id=memory_bandwidth_saturated"]],
)
def test_a_reader_that_closes_stdout_ends_the_command_quietly(args: list[str], seeded_kb: Path) -> None:
    # `kb-mcp ... | head -1`: the reader is gone before the command writes (its end of the pipe closed)
    proc = subprocess.Popen([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(seeded_kb), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == stdout.READER_GONE
    assert err == ""


REPO = Path(__file__).resolve().parents[2]
_REPO_PATH = re.compile(r"(?<![\w./~-])((?:[\w.-]+/)+[\w.-]+)")  # a/b/c.py, not ~/x or tcp://h:1


def _helps(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """(prog, --help text) of the parser and every command and action under it."""
    found = [(parser.prog, parser.format_help())]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _helps(sub)
    return found


def test_every_repository_path_in_the_help_texts_exists() -> None:
    folders = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    named = [(prog, path) for prog, text in _helps(cli.build_parser()) for path in _REPO_PATH.findall(text)
             if path.split("/")[0] in folders]
    assert ("kb-mcp", "docs/agents.md") in named  # the pattern finds what the top-level help names
    assert [(prog, path) for prog, path in named if not (REPO / path).exists()] == []
