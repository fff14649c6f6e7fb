"""Bearer-token refusals over real HTTP: a spawned `kb-mcp serve --http`, raw requests as any client
sends them, the SDK's client, and `kb-mcp call --url`. A refusal says what is wrong (missing, empty,
unexpanded or wrong token) in its body and WWW-Authenticate header, and nothing invites OAuth
discovery: no resource metadata in the challenge, and every /.well-known/ path answers 404."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from serverproc import http_server

from kb_mcp.clients.mcp_client import call_json, connect_http

TOKEN = "auth-test-token-0123456789abcdef"
INIT = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
WELL_KNOWN = (
    "/.well-known/oauth-protected-resource",
    "/.well-known/oauth-protected-resource/mcp",
    "/.well-known/oauth-authorization-server",
    "/.well-known/openid-configuration",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    home = tmp_path_factory.mktemp("auth")
    kb, token_file = home / "kb.json", home / "token"
    token_file.write_text(TOKEN)
    with http_server(kb, ["--http", "127.0.0.1:0", "--token-file", str(token_file)],
                     env={"KB_MCP_TOKEN": ""}) as running:
        yield running


def _post(url: str, authorization: str | None) -> httpx2.Response:
    headers = dict(HEADERS) if authorization is None else {**HEADERS, "Authorization": authorization}
    return httpx2.post(url, json=INIT, headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("authorization", "error", "words"),
    [
        (None, "invalid_request", "no bearer token"),
        ("Bearer", "invalid_request", "token is empty"),
        ("Bearer ${KB_MCP_TOKEN}", "invalid_token", "unexpanded text '${KB_MCP_TOKEN}'"),
        ("Bearer not-the-token-0123456789", "invalid_token", "not one of this server's tokens"),
    ],
)
def test_a_refusal_names_its_reason(server, authorization: str | None, error: str, words: str) -> None:  # type: ignore[no-untyped-def]
    refused = _post(server.url, authorization)
    assert refused.status_code == 401
    body = refused.json()
    assert body["error"] == error and words in body["error_description"]
    challenge = refused.headers["www-authenticate"]
    assert challenge.startswith(f'Bearer realm="kb-mcp", error="{error}"') and words in challenge
    assert "resource_metadata" not in challenge


def test_the_server_log_names_an_unexpanded_client_variable(server) -> None:  # type: ignore[no-untyped-def]
    _post(server.url, "Bearer ${KB_MCP_TOKEN}")
    assert "unexpanded text '${KB_MCP_TOKEN}'" in server.stderr


@pytest.mark.parametrize("path", WELL_KNOWN)
def test_no_oauth_discovery_endpoint_exists(server, path: str) -> None:  # type: ignore[no-untyped-def]
    base = server.url.removesuffix("/mcp")
    answer = httpx2.get(base + path, timeout=30)
    assert answer.status_code == 404
    assert "does not use OAuth" in answer.json()["error_description"]


def test_the_banner_warns_that_this_shell_would_send_an_empty_token(server) -> None:  # type: ignore[no-untyped-def]
    assert "KB_MCP_TOKEN is empty in this shell" in server.stderr


async def test_the_sdk_client_connects_with_the_token(server) -> None:  # type: ignore[no-untyped-def]
    async with connect_http(server.url, TOKEN) as client:
        got = await call_json(client, "suggest_optimizations", {"state_id": "memory_bandwidth_saturated", "k": 1})
    assert got["state_id"] == "memory_bandwidth_saturated"


def test_call_url_prints_the_servers_reason(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    refused = subprocess.run(
        [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp_path / "kb.json"), "call", "--list",
         "--url", server.url],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "KB_MCP_TOKEN": "${KB_MCP_TOKEN}"},  # a configuration that sent the variable's name
    )
    assert refused.returncode == 2
    assert "unexpanded text '${KB_MCP_TOKEN}'" in refused.stderr
