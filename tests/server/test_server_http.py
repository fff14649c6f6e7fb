"""End to end over streamable HTTP: a spawned `kb-mcp serve --http`, the SDK's real client, bearer
tokens (401 without), the Host allow-list (DNS-rebinding protection) and the refusal to serve a
network address without a token."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from serverproc import http_server

from kb_mcp.clients.mcp_client import ToolCallError, call_json, connect_http
from kb_mcp.server.cli import main
from kb_mcp.server.registry import load_tools

TOKEN = "s3cret-token-for-tests-0123456789"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _post(url: str, headers: dict[str, str]) -> httpx2.Response:
    return httpx2.post(url, json=INIT, headers={**HEADERS, **headers}, timeout=30)


async def test_token_server_serves_a_real_client_and_refuses_others(kb_path: Path) -> None:
    with http_server(kb_path, ["--http", "127.0.0.1:0"], env={"KB_MCP_TOKEN": TOKEN}) as server:
        async with connect_http(server.url, TOKEN) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            expected = {spec.name for spec in load_tools()} | {"start_job", "job_status", "cancel_job"}
            assert set(tools) == expected
            for spec in load_tools():  # every product tool's schema is its module's Request model
                assert tools[spec.name].input_schema["properties"] == spec.request.model_json_schema()["properties"]
            assert tools["job_status"].input_schema["required"] == ["job_id"]
            stats = await client.read_resource("kb://stats")
            assert str(kb_path) in stats.contents[0].text  # type: ignore[union-attr]
            with pytest.raises(ToolCallError, match="not a job id"):
                await call_json(client, "job_status", {"job_id": "nope"})

        missing = _post(server.url, {})
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Bearer")
        assert _post(server.url, {"Authorization": "Bearer wrong-token-0123456789"}).status_code == 401
        assert _post(server.url, {"Authorization": TOKEN}).status_code == 401  # no scheme
        assert _post(server.url, {"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        # right token, but a Host name nobody allowed: DNS-rebinding protection answers 421
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        rebound = _post(server.url, {"Authorization": f"Bearer {TOKEN}", "Host": f"evil.example:{port}"})
        assert rebound.status_code == 421
        assert "tools: " in server.stderr and "claude mcp add --transport http" in server.stderr
        assert "bearer token required" in server.stderr


async def test_token_from_the_environment_and_an_allowed_host(kb_path: Path) -> None:
    args = ["--http", "127.0.0.1:0", "--allow-host", "kb-team.example"]
    with http_server(kb_path, args, env={"KB_MCP_TOKEN": TOKEN}) as server:
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        assert _post(server.url, {}).status_code == 401
        allowed = _post(server.url, {"Authorization": f"Bearer {TOKEN}", "Host": f"kb-team.example:{port}"})
        assert allowed.status_code == 200
        other = _post(server.url, {"Authorization": f"Bearer {TOKEN}", "Host": f"kb-team.example.evil:{port}"})
        assert other.status_code == 421
        origin = _post(server.url, {"Authorization": f"Bearer {TOKEN}", "Origin": "http://evil.example"})
        assert origin.status_code == 403


async def test_loopback_without_token_is_open_to_local_clients(kb_path: Path) -> None:
    with http_server(kb_path) as server:
        assert "bearer token off" in server.stderr
        async with connect_http(server.url) as client:
            names = {t.name for t in (await client.list_tools()).tools}
        assert {"start_job", "job_status", "cancel_job"} <= names


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--http", "10.11.12.13:0"], 2, "refusing to serve on 10.11.12.13 without a bearer token"),
        (["--http", "10.11.12.13:0", "--token-file", "{short}"], 2, "too short"),
        (["--http", "0.0.0.0:0", "--token-file", "{token}"], 2, "--allow-host"),
        (["--http", "10.11.12.13:0", "--token-file", "{missing}"], 1, "cannot read the token file"),  # the caller's
        (["--http", "10.11.12.13:0", "--token", TOKEN], 2, "--token is not accepted"),
        (["--http", "nonsense"], 2, "HOST:PORT"),
    ],
)
def test_unsafe_or_broken_http_configs_refuse_to_start(
    kb_path: Path, args: list[str], status: int, message: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KB_MCP_TOKEN", raising=False)
    files = {"short": kb_path.parent / "short", "token": kb_path.parent / "token",
             "missing": kb_path.parent / "missing"}
    files["short"].write_text("short\n")
    files["token"].write_text(TOKEN + "\n")
    args = [a.format(**files) for a in args]
    # the console entry point's own function, in this process: it must return before serving anything
    assert main(["--kb", str(kb_path), "serve", *args]) == status
    out, err = capsys.readouterr()
    assert message in err and out == ""
    assert not kb_path.exists()  # refused before touching the KB
