"""The shipped agent configs (Claude Code, Claude Desktop, Cursor, VS Code, Codex; stdio and HTTP) parse, and what they
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

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from kb_mcp.clients.mcp_client import call_json, connect_http

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "clients" / "configs"
DOCS = ROOT / "docs" / "agents.md"
sys.path.insert(0, str(ROOT / "tests" / "server"))
from serverproc import http_server  # noqa: E402

STDIO = {
    "claude-code.mcp.json": "mcpServers",
    "claude-desktop.json": "mcpServers",
    "cursor.mcp.json": "mcpServers",
    "vscode.mcp.json": "servers",
}
CODEX = ("codex.config.toml", "codex-http.config.toml")
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
    assert {p.name for p in CONFIGS.iterdir()} == set(STDIO) | set(HTTP) | set(CODEX)


def _stdio_commands() -> dict[str, tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]]:
    """What each stdio config (and the documented `claude mcp add` line) tells the agent to run."""
    commands = {}
    for name, key in STDIO.items():
        entry = _server_entry(name, key)
        assert entry.get("type", "stdio") == "stdio"
        commands[name] = (entry["command"], tuple(entry["args"]), tuple(sorted(entry.get("env", {}).items())))
    lines = re.findall(r"^claude mcp add kb-mcp -- (.+)$", DOCS.read_text(), flags=re.M)
    assert len(lines) == 1, lines
    argv = shlex.split(lines[0])
    commands["docs/agents.md"] = (argv[0], tuple(argv[1:]), ())
    return commands


async def test_stdio_configs_start_a_server_a_client_can_talk_to(tmp_path: Path) -> None:
    commands = _stdio_commands()
    assert commands["cursor.mcp.json"][:2] == ("kb-mcp", ("serve",))
    # identical commands start identical servers: each distinct one is started once
    for i, (command, args, env) in enumerate(sorted(set(commands.values()))):
        kb = tmp_path / f"kb{i}.json"
        full_env = {**os.environ, **dict(env), "KB_MCP_KB": str(kb)}
        await _talk(StdioServerParameters(command=_executable(command), args=list(args), env=full_env))
        assert kb.exists()  # it served the KB the environment named


async def test_http_configs_reach_a_token_server(kb_path: Path) -> None:
    with http_server(kb_path, ["--http", "127.0.0.1:0"], env={"KB_MCP_TOKEN": TOKEN}) as server:
        for name, (key, placeholder) in sorted(HTTP.items()):
            config = json.loads((CONFIGS / name).read_text())
            entry = config[key]["kb-mcp"]
            assert entry.get("type", "http") == "http" and entry["url"] == "http://127.0.0.1:8765/mcp", name
            assert entry["headers"] == {"Authorization": f"Bearer {placeholder}"}, name
            if placeholder.startswith("${input:"):
                declared = {i["id"]: i for i in config["inputs"]}
                assert declared["kb-mcp-token"]["password"] is True
            url = entry["url"].replace("127.0.0.1:8765", server.url.split("//")[1].split("/")[0])
            headers = {k: v.replace(placeholder, TOKEN) for k, v in entry["headers"].items()}
            async with connect_http(url, headers=headers) as client:
                got = await call_json(client, "suggest_optimizations", {"state_id": STATE, "k": 1})
            assert got["state_id"] == STATE, name


def test_the_documented_http_command_matches_the_shipped_config() -> None:
    documented = re.findall(r"^claude mcp add --transport http kb-mcp (\S+) --header \"(.+)\"$", DOCS.read_text(),
                            flags=re.M)
    assert documented == [("http://gpu-box.lan:8765/mcp", "Authorization: Bearer $KB_MCP_TOKEN")]
    shipped = _server_entry("claude-code-http.mcp.json", "mcpServers")
    assert shipped["headers"]["Authorization"].replace("${KB_MCP_TOKEN}",
                                                       "$KB_MCP_TOKEN") == documented[0][1].split(": ", 1)[1]


def _codex(name: str) -> dict[str, Any]:
    servers = tomllib.loads((CONFIGS / name).read_text())["mcp_servers"]
    assert set(servers) == {"kb-mcp"}
    return servers["kb-mcp"]


async def test_codex_starts_a_server_with_only_the_variables_it_forwards(tmp_path: Path) -> None:
    entry = _codex("codex.config.toml")
    assert entry["tool_timeout_sec"] >= 600 and entry["startup_timeout_sec"] >= 30
    assert {"KB_MCP_KB", "KB_MCP_HOME", "KB_MCP_CACHE"} <= set(entry["env_vars"])
    kb = tmp_path / "codex-kb.json"
    mine = {"KB_MCP_KB": str(kb), "KB_MCP_CACHE": str(tmp_path / "cache"), "UNRELATED": "x"}
    # Codex hands the server a few basics plus the variables named in env_vars, nothing else
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **{k: v for k,
                                                                 v in mine.items() if k in entry["env_vars"]}}
    await _talk(StdioServerParameters(command=_executable(entry["command"]), args=list(entry["args"]), env=env))
    assert kb.exists()


async def test_codex_http_reaches_a_token_server_with_its_token_variable(kb_path: Path) -> None:
    entry = _codex("codex-http.config.toml")
    assert entry["url"] == "http://127.0.0.1:8765/mcp" and entry["bearer_token_env_var"] == "KB_MCP_TOKEN"
    with http_server(kb_path, ["--http", "127.0.0.1:0"], env={"KB_MCP_TOKEN": TOKEN}) as server:
        url = entry["url"].replace("127.0.0.1:8765", server.url.split("//")[1].split("/")[0])
        env = {entry["bearer_token_env_var"]: TOKEN}  # Codex sends "Bearer <that variable>"
        async with connect_http(url, env[entry["bearer_token_env_var"]]) as client:
            got = await call_json(client, "suggest_optimizations", {"state_id": STATE, "k": 1})
    assert got["state_id"] == STATE


def test_docs_show_every_host() -> None:
    text = DOCS.read_text()
    for host in ("Claude Code", "Claude Desktop", "Cursor", "VS Code", "Codex"):
        assert f"**{host}**" in text, host
    for name in [*STDIO, *HTTP, *CODEX]:
        assert f"(../clients/configs/{name})" in text, name
