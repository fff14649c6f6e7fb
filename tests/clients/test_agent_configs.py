"""The shipped agent configs (Claude Code, Cursor, VS Code; stdio and HTTP) parse, and what they
tell the agent to run or reach is a server a real MCP client can talk to. The one-line setup
commands in docs/agents.md are checked the same way."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from kb_mcp.clients.mcp_client import call_json, connect_http

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "clients" / "configs"
DOCS = ROOT / "docs" / "agents.md"
sys.path.insert(0, str(ROOT / "tests" / "server"))
from serverproc import http_server  # noqa: E402

STDIO = {"claude-code.mcp.json": "mcpServers", "cursor.mcp.json": "mcpServers", "vscode.mcp.json": "servers"}
HTTP = {
    "claude-code-http.mcp.json": ("mcpServers", "${KB_MCP_TOKEN}"),
    "cursor-http.mcp.json": ("mcpServers", "${env:KB_MCP_TOKEN}"),
    "vscode-http.mcp.json": ("servers", "${input:kb-mcp-token}"),
}
TOKEN = "config-token-0123456789abcdef"
STATE = "memory_bandwidth_saturated"


def _server_entry(name: str, key: str) -> dict[str, Any]:
    config = json.loads((CONFIGS / name).read_text())
    assert set(config[key]) == {"kb-mcp"}
    return config[key]["kb-mcp"]


def _executable(command: str) -> str:
    """The agent runs `command` from its PATH; here that is this interpreter's environment."""
    found = shutil.which(command) or shutil.which(command, path=str(Path(sys.executable).parent))
    assert found, f"{command} is neither on PATH nor beside {sys.executable} (is kb-mcp installed?)"
    return found


async def _talk(params: StdioServerParameters) -> None:
    async with Client(params) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"suggest_optimizations", "record_outcome", "start_job", "job_status"} <= names
        got = await call_json(client, "suggest_optimizations", {"state_id": STATE, "k": 1})
        assert got["state_id"] == STATE


def test_every_shipped_config_is_listed_here() -> None:
    assert {p.name for p in CONFIGS.glob("*.json")} == set(STDIO) | set(HTTP)


@pytest.mark.parametrize("name", sorted(STDIO))
async def test_stdio_config_starts_a_server_a_client_can_talk_to(name: str, kb_path: Path) -> None:
    entry = _server_entry(name, STDIO[name])
    assert entry.get("type", "stdio") == "stdio"
    assert entry["command"] == "kb-mcp" and entry["args"] == ["serve"]
    env = {**os.environ, **entry.get("env", {}), "KB_MCP_KB": str(kb_path)}
    await _talk(StdioServerParameters(command=_executable(entry["command"]), args=entry["args"], env=env))
    assert kb_path.exists()  # it served the KB the environment named


@pytest.mark.parametrize("name", sorted(HTTP))
async def test_http_config_reaches_a_token_server(name: str, kb_path: Path) -> None:
    key, placeholder = HTTP[name]
    config = json.loads((CONFIGS / name).read_text())
    entry = config[key]["kb-mcp"]
    assert entry.get("type", "http") == "http" and entry["url"] == "http://127.0.0.1:8765/mcp"
    assert entry["headers"] == {"Authorization": f"Bearer {placeholder}"}
    if placeholder.startswith("${input:"):
        declared = {i["id"]: i for i in config["inputs"]}
        assert declared["kb-mcp-token"]["password"] is True
    with http_server(kb_path, ["--http", "127.0.0.1:0", "--token", TOKEN]) as server:
        url = entry["url"].replace("127.0.0.1:8765", server.url.split("//")[1].split("/")[0])
        headers = {k: v.replace(placeholder, TOKEN) for k, v in entry["headers"].items()}
        async with connect_http(url, headers=headers) as client:
            got = await call_json(client, "suggest_optimizations", {"state_id": STATE, "k": 1})
        assert got["state_id"] == STATE


async def test_the_documented_claude_code_command_starts_a_server(kb_path: Path) -> None:
    lines = re.findall(r"^claude mcp add kb-mcp -- (.+)$", DOCS.read_text(), flags=re.M)
    assert lines == ["kb-mcp serve"]
    argv = shlex.split(lines[0])
    env = {**os.environ, "KB_MCP_KB": str(kb_path)}
    await _talk(StdioServerParameters(command=_executable(argv[0]), args=argv[1:], env=env))


def test_the_documented_http_command_matches_the_shipped_config() -> None:
    documented = re.findall(r"^claude mcp add --transport http kb-mcp (\S+) --header \"(.+)\"$", DOCS.read_text(), flags=re.M)
    assert documented == [("http://gpu-box.lan:8765/mcp", "Authorization: Bearer $KB_MCP_TOKEN")]
    shipped = _server_entry("claude-code-http.mcp.json", "mcpServers")
    assert shipped["headers"]["Authorization"].replace("${KB_MCP_TOKEN}", "$KB_MCP_TOKEN") == documented[0][1].split(": ", 1)[1]
