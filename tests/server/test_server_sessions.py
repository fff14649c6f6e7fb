"""How many MCP sessions one client of an HTTP server may hold open (`server.sessions`): over a spawned
`kb-mcp serve --http --agents-file` with real MCP clients, a client at its limit is refused a new session
(429, saying it is the client's to fix and how), while other clients, and its own sessionless calls,
go on; a session it ends gives it room for a new one."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from serverproc import HttpServer, http_server, session_client, wait_until

from kb_mcp.clients.mcp_client import call_json, connect_http
from kb_mcp.server.agents import Credentials
from kb_mcp.server.sessions import SessionCap
from kb_mcp.server.transport import BearerGate

SHARED = "shared-token-for-tests-0123456789"
ALICE = "alice-token-for-tests-0123456789"
BOB = "bob-token-for-tests-01234567890ab"
LIMIT = 3
STATE = "memory_bandwidth_saturated"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "looper", "version": "0"}}}


@pytest.fixture
def server(kb_path: Path, tmp_path: Path) -> Iterator[HttpServer]:
    agents = tmp_path / "agents"
    agents.write_text(f"alice {ALICE}\nbob {BOB}\n")
    agents.chmod(0o600)
    env = {"KB_MCP_TOKEN": SHARED, "KB_MCP_SESSIONS_PER_CLIENT": str(LIMIT)}
    with http_server(kb_path, ["--http", "127.0.0.1:0", "--agents-file", str(agents)], env=env) as running:
        yield running


def _open_session(url: str, token: str) -> httpx2.Response:
    """One `initialize` without an Mcp-Session-Id, as a client opening sessions in a loop sends it."""
    with httpx2.Client(timeout=30) as http:
        return http.post(url, json=INITIALIZE, headers={"Authorization": f"Bearer {token}",
                                                        "Accept": "application/json, text/event-stream"})


def _refused(answer: httpx2.Response) -> dict[str, Any]:
    assert answer.status_code == 429, (answer.status_code, answer.text)
    assert answer.headers["retry-after"] == "1800" and answer.headers["content-type"] == "application/json"
    body: dict[str, Any] = answer.json()
    assert body["error"] == "too_many_sessions" and (body["open_sessions"], body["limit"]) == (LIMIT, LIMIT), body
    return body


async def test_a_client_at_its_session_limit_is_refused_in_words_and_others_still_open_sessions(
        server: HttpServer) -> None:
    """Before, one token could open sessions until the SDK's 10 000 were open, and then every client
    was refused (a 503 naming no one) until they idled out half an hour later."""
    async with AsyncExitStack() as alices:
        for _ in range(LIMIT):
            await alices.enter_async_context(session_client(server.url, ALICE))
        said = " ".join(_refused(_open_session(server.url, ALICE))["error_description"].split())
        for words in (f"agent:alice already has {LIMIT} MCP sessions open", f"KB_MCP_SESSIONS_PER_CLIENT={LIMIT}",
                      "This is the client's to fix", "an HTTP DELETE to the MCP endpoint with the session's "
                      "Mcp-Session-Id header", "a session with no request for 30 minutes is closed",
                      "Other clients are not affected"):
            assert words in said, said
        with pytest.raises(Exception):  # noqa: B017 - a real MCP client of alice's cannot open one either
            async with session_client(server.url, ALICE):
                pass
        async with session_client(server.url, BOB) as bob:  # bob's sessions are his own
            assert (await call_json(bob, "suggest_optimizations", {"state_id": STATE}))["suggestions"]
        async with connect_http(server.url, ALICE) as sessionless:  # the sessionless protocol opens none
            assert (await call_json(sessionless, "suggest_optimizations", {"state_id": STATE}))["suggestions"]
    # alice's clients closed their sessions (each sends a DELETE): she has room again
    async with AsyncExitStack() as alices:
        for _ in range(LIMIT):
            client = await alices.enter_async_context(session_client(server.url, ALICE))
        assert (await call_json(client, "suggest_optimizations", {"state_id": STATE}))["suggestions"]
    assert server.proc.poll() is None


async def test_a_session_its_client_deletes_makes_room_for_one_more(server: HttpServer) -> None:
    async with AsyncExitStack() as alices:
        for _ in range(LIMIT - 1):
            await alices.enter_async_context(session_client(server.url, ALICE))
        last = _open_session(server.url, ALICE)
        assert last.status_code == 200, last.text
        _refused(_open_session(server.url, ALICE))
        with httpx2.Client(timeout=30) as http:
            ended = http.delete(server.url, headers={"Authorization": f"Bearer {ALICE}",
                                                     "Mcp-Session-Id": last.headers["mcp-session-id"],
                                                     "MCP-Protocol-Version": "2025-11-25"})
        assert ended.status_code == 200, ended.text
        async with session_client(server.url, ALICE) as again:
            assert (await call_json(again, "suggest_optimizations", {"state_id": STATE}))["suggestions"]
            _refused(_open_session(server.url, ALICE))  # the place the DELETE freed is taken again


def test_every_holder_of_the_shared_token_counts_as_one_client_and_is_told_so(server: HttpServer) -> None:
    opened = [_open_session(server.url, SHARED) for _ in range(LIMIT)]
    assert [a.status_code for a in opened] == [200] * LIMIT
    said = " ".join(_refused(_open_session(server.url, SHARED))["error_description"].split())
    assert "Every client of the shared token counts as this one client" in said and "agents file" in said, said
    assert _open_session(server.url, ALICE).status_code == 200  # an agent with a token of its own still opens one


def test_the_sdk_still_records_who_opened_each_session() -> None:
    """The limit reads the SDK's private record of session owners (mcp 2.3 has no public one): an SDK
    that drops it must fail here and refuse to serve, not serve without a limit."""
    manager = StreamableHTTPSessionManager(app=Server("probe"))
    assert SessionCap(manager, 1).open_sessions("agent:alice") == 0
    with pytest.raises(RuntimeError, match="keeps no record of who opened each session"):
        SessionCap(object(), 1)


@contextmanager
def _gated_server(session_idle_timeout: float, limit: int) -> Iterator[str]:
    """A bare MCP server in this process behind the gate, its sessions closed after `session_idle_timeout`
    idle seconds (kb-mcp's own keeps the SDK's 30 minutes); yields its URL."""
    import uvicorn

    mcp = Server("probe")
    app = mcp.streamable_http_app(session_idle_timeout=session_idle_timeout, host="127.0.0.1")
    gate = BearerGate(app, Credentials(SHARED, None), sessions=SessionCap(mcp.session_manager, limit))
    running = uvicorn.Server(uvicorn.Config(gate, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: running.started, timeout=30)
        yield f"http://127.0.0.1:{running.servers[0].sockets[0].getsockname()[1]}/mcp"
    finally:
        running.should_exit = True
        thread.join(30)


def test_a_session_closed_for_being_idle_frees_its_place() -> None:
    """The SDK closes an idle session itself (no DELETE reaches the gate): its place is free again."""
    with _gated_server(session_idle_timeout=0.5, limit=1) as url:
        assert _open_session(url, SHARED).status_code == 200
        assert _open_session(url, SHARED).status_code == 429
        assert wait_until(lambda: _open_session(url, SHARED).status_code == 200, timeout=20, interval=0.3)
