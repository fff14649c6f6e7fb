"""The docs say what the code does: the files they name exist, and the counts, tools and resources
they give are the ones the suite and the server hold."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest

from kb_mcp.server.app import build_server
from kb_mcp.server.cli import COMMANDS, build_parser
from kb_mcp.tools.context import ToolContext

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "adversarial"))
from adversarial_cases import CHEATS  # noqa: E402 - the suite's own list of its cases

# Records of what ran when (the paths as they were then), not descriptions of the code today.
HISTORY = {"gpu-runs.md", "benchmarks.md"}
_TOP = "|".join(("harness", "kb", "policy", "tools", "server", "campaign", "bench", "scripts", "tests",
                 "examples", "docs", "profiling", "clients", "decomposition", r"\.ci"))
# A repository file in backticks: a top-level folder, then a path ending in a file type.
_FILE = re.compile(rf"`((?:{_TOP})/[\w./-]+\.(?:py|md|sh|toml|json|txt))`")


def _described() -> list[Path]:
    return [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in HISTORY)]


def test_every_file_the_docs_name_exists() -> None:
    missing = [f"{doc.relative_to(ROOT)}:{n}: {m.group(1)}"
               for doc in _described()
               for n, line in enumerate(doc.read_text().splitlines(), 1)
               for m in _FILE.finditer(line)
               if not (ROOT / m.group(1)).exists()]
    assert not missing, "files named in the docs that are not in the repository:\n" + "\n".join(missing)


def _commands(text: str) -> list[str]:
    """Every `kb-mcp ...` command line a doc shows: in code blocks (continued lines joined) and in backticks."""
    shown = [" ".join(m.group(1).split()) for m in re.finditer(r"`(kb-mcp [^`]+)`", text)]
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        shown += [line.split(" #")[0] for line in block.replace("\\\n", " ").splitlines() if "kb-mcp " in line]
    return shown


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def _unknown_words(command: str, top: argparse.ArgumentParser) -> list[str]:
    """The commands and options of `command` (one `kb-mcp` call of its line on) the CLI does not have.
    A word that is neither (a value, a placeholder) is passed over; `a|b` names alternatives."""
    unknown: list[str] = []
    parser, chain = top, ["kb-mcp"]
    for word in command.split()[1:]:
        if word in ("|", "&&", ";", "--") or word.startswith((">", "2>", "|")):
            break
        subs = _subcommands(parser)
        if word.startswith("--"):
            option = word.split("=")[0].rstrip(",.;:)")
            # `kb-mcp`'s own options (--kb, --version) come before its command: `kb-mcp kb stats --kb K` is refused
            allowed = _options(parser) | (_options(top) if parser is top else set())
            if re.fullmatch(r"--[a-z][a-z0-9-]*", option) and option not in allowed:
                unknown.append(f"{' '.join(chain)} {option}")
        elif subs and re.fullmatch(r"[a-z][a-z|-]*", word) and chain[-1] != "call":
            names = word.split("|")
            unknown += [f"{' '.join(chain)} {n}" for n in names if n not in subs]
            if names[0] not in subs:
                break
            parser = subs[names[0]]
            chain.append(names[0])
    return unknown


def test_every_command_and_option_the_docs_show_is_the_clis() -> None:
    top = build_parser(None)
    wrong = [f"{doc.relative_to(ROOT)}: `{shown}`: no {word}"
             for doc in [*_described(), *(ROOT / "docs" / name for name in sorted(HISTORY))]
             for line in _commands(doc.read_text())
             for shown in (line[m.start():] for m in re.finditer(r"(?<![\w-])kb-mcp (?=-?-?[a-z])", line))
             if shown.split()[1] in COMMANDS or shown.split()[1].startswith("--")
             for word in _unknown_words(shown, top)]
    assert not wrong, "commands in the docs the CLI does not have:\n" + "\n".join(wrong)


def test_the_command_check_finds_an_option_or_command_the_cli_lacks() -> None:
    top = build_parser(None)
    assert _unknown_words("kb-mcp --kb k.json kb export out.json --format reference --force", top) == []
    assert _unknown_words("kb-mcp kb states|candidates --json", top) == []
    assert _unknown_words("kb-mcp kb export out.json --overwrite", top) == ["kb-mcp kb export --overwrite"]
    assert _unknown_words("kb-mcp kb vacuum", top) == ["kb-mcp kb vacuum"]
    assert _unknown_words("kb-mcp serve --stdio", top) == ["kb-mcp serve --stdio"]
    assert _unknown_words("kb-mcp kb stats --kb k.json", top) == ["kb-mcp kb stats --kb"]


# The folders that install as kb_mcp (pyproject's package-dir): the code whose settings a user sets.
PACKAGE = ("harness", "kb", "policy", "tools", "server", "campaign", "profiling", "clients", "decomposition")
# Names in the code that are no setting of kb-mcp's, with why.
NOT_SETTINGS = {
    "KB_MCP_": "the prefix the doctor lists set variables by",
    "KB_MCP_TOKEN_FILE": "a variable name the redaction passes over (tools/disclosure.py); nothing reads it",
}


def _settings_read() -> set[str]:
    """Every `KB_MCP_` variable the package's code names; one ending in `_` is a prefix (`KB_MCP_LLM_MODEL_`
    for KB_MCP_LLM_MODEL_<ROLE>)."""
    return {name for folder in PACKAGE for path in (ROOT / folder).rglob("*.py")
            for name in re.findall(r'"(KB_MCP_[A-Z0-9_]*)"', path.read_text())} - set(NOT_SETTINGS)


def test_the_docs_name_every_setting_the_code_reads() -> None:
    documented = {name for doc in _described() for name in re.findall(r"KB_MCP_[A-Z0-9_]*", doc.read_text())}
    missing = sorted(name for name in _settings_read()
                     if not any(d == name or (name.endswith("_") and d.startswith(name)) for d in documented))
    assert not missing, "KB_MCP_ settings the code reads that README.md and docs/*.md never name: " + ", ".join(missing)


def test_the_readme_counts_the_cheats_the_suite_holds() -> None:
    said = re.search(r"and (\d+) known cheats in its test suite", (ROOT / "README.md").read_text())
    assert said is not None, "README.md no longer says how many cheats the suite holds"
    assert int(said.group(1)) == len(CHEATS)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], set[str], str]:
    """The tool names, the resource URIs (templates included) and the instructions of a real server."""
    import anyio

    server = build_server(ToolContext(tmp_path_factory.mktemp("docs") / "kb.json"))

    async def listing() -> tuple[set[str], set[str]]:
        tools = {t.name for t in await server.list_tools()}
        uris = {str(r.uri) for r in await server.list_resources()}
        uris |= {t.uri_template for t in await server.list_resource_templates()}
        return tools, uris

    tools, uris = anyio.run(listing)
    return tools, uris, server.instructions or ""


@pytest.mark.parametrize("doc", ["README.md", "docs/agents.md"])
def test_the_docs_name_every_tool_and_resource_the_server_serves(
        doc: str, served: tuple[set[str], set[str], str]) -> None:
    tools, uris, _ = served
    text = (ROOT / doc).read_text()
    # a template's argument may be spelled shorter in prose: kb://state/{id} for kb://state/{state_id}
    shown = {re.sub(r"\{\w+\}", "{}", u) for u in re.findall(r"`(kb://[^`]+)`", text)}
    assert {t for t in tools if f"`{t}`" not in text} == set()
    assert {u for u in uris if re.sub(r"\{\w+\}", "{}", u) not in shown} == set()


def test_the_servers_instructions_name_every_resource(served: tuple[set[str], set[str], str]) -> None:
    _, uris, instructions = served
    shown = {re.sub(r"\{\w+\}", "{}", u.rstrip(".,;)")) for u in re.findall(r"kb://\S+", instructions)}
    assert {u for u in uris if re.sub(r"\{\w+\}", "{}", u) not in shown} == set()


def test_the_exit_status_table_is_the_one_every_command_answers_by() -> None:
    from kb_mcp.server import exit_status

    text = (ROOT / "docs" / "agents.md").read_text()
    section = text.split("\n## Exit statuses\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| ([a-z -]+) \|", section, re.M)
    assert {int(status): whose for status, whose in rows} == exit_status.STATUSES


def test_the_per_client_bounds_table_says_what_the_code_does() -> None:
    from kb_mcp.campaign import caps, owners
    from kb_mcp.server import job_slots, job_store, logs, session_limit, transport
    from kb_mcp.tools import candidate_store
    from kb_mcp.tools.source import MAX_SOURCE_BYTES

    text = (ROOT / "docs" / "agents.md").read_text()
    section = text.split("**What one client may use.**", 1)[1].split("\n\n", 2)[1]  # the table
    rows = {bound: (int(n), setting.strip("`")) for bound, n, setting in
            re.findall(r"^\| ([^|]+?) \| (\d+) \| ([^|]+?) \|", section, re.M)}
    assert rows == {
        "MCP sessions open at once": (session_limit.DEFAULT_SESSIONS_PER_CLIENT, session_limit.ENV_SESSIONS_PER_CLIENT),
        "jobs queued or running": (job_slots.MAX_JOBS_PER_SUBMITTER, "-"),
        "long jobs (campaigns) queued or running": (job_slots.MAX_LONG_JOBS_PER_SUBMITTER, "-"),
        "finished job records kept": (job_store.JOBS_KEPT_PER_CLIENT, job_store.ENV_JOBS_KEPT_PER_CLIENT),
        "finished campaigns kept (folders)": (owners.CAMPAIGNS_KEPT_PER_CLIENT, owners.ENV_CAMPAIGNS_KEPT_PER_CLIENT),
        **{bound: (caps.CAPPED[option].default, caps.CAPPED[option].setting) for bound, option in (
            ("problems a campaign takes", "problems"),
            ("iterations (trajectories per problem) of a campaign", "iterations"),
            ("steps per trajectory of a campaign", "steps"),
            ("fix or generate attempts of a campaign", "fix_attempts"),
            ("trajectories of a campaign at once", "parallel"))},
        "candidates kept that nothing needs": (candidate_store.CANDIDATES_KEPT_PER_CLIENT,
                                               candidate_store.ENV_CANDIDATES_KEPT_PER_CLIENT),
        "outcomes credited per candidate": (1, "-"),
        "size of a problem or candidate (MiB)": (MAX_SOURCE_BYTES >> 20, "-"),
        "size of an HTTP request body (MiB)": (transport.MAX_REQUEST_BYTES >> 20, "-"),
        "log lines a minute, per kind of refusal": (logs.refusals.burst * 60 // int(logs.refusals.window_s), "-"),
    }
