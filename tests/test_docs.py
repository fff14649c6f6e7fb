"""The docs say what the code does: the files they name exist, and the counts, tools and resources
they give are the ones the suite and the server hold."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from kb_mcp.server.app import build_server
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
