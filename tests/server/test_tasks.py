"""MCP Tasks over real HTTP, as a 2025-11-25 client speaks them on the wire (raw JSON-RPC over
streamable HTTP to a spawned `kb-mcp serve --http`): the capability, taskSupport on the tools, a
task-augmented tools/call answered with a task, tasks/get, tasks/result, tasks/list, tasks/cancel,
and the task being the job `job_status` knows. Clients on 2026-07-28 are offered no Tasks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from serverproc import http_server

from kb_mcp.clients.mcp_client import stdio_params

VERSION = "2025-11-25"
STATE = "memory_bandwidth_saturated"


class Wire:
    """A minimal streamable-HTTP JSON-RPC client: one session, answers read from JSON or SSE."""

    def __init__(self, url: str) -> None:
        self.url, self.session, self.next_id = url, "", 0
        self.http = httpx2.Client(timeout=60)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if self.session:
            headers |= {"Mcp-Session-Id": self.session, "MCP-Protocol-Version": VERSION}
        return headers

    def notify(self, method: str) -> None:
        self.http.post(self.url, json={"jsonrpc": "2.0", "method": method}, headers=self._headers())

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method,
                **({"params": params} if params is not None else {})}
        response = self.http.post(self.url, json=body, headers=self._headers())
        assert response.status_code == 200, response.text
        self.session = self.session or response.headers.get("mcp-session-id", "")
        if response.headers["content-type"].startswith("text/event-stream"):
            messages = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
            return next(m for m in messages if m.get("id") == self.next_id)
        return response.json()


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Wire, dict[str, Any]]]:
    kb = tmp_path_factory.mktemp("tasks") / "kb.json"
    with http_server(kb) as server:
        client = Wire(server.url)
        init = client.call("initialize", {"protocolVersion": VERSION, "capabilities": {},
                                          "clientInfo": {"name": "wire", "version": "0"}})
        client.notify("notifications/initialized")
        yield client, init["result"]
        client.http.close()


def test_the_server_offers_tasks_for_tool_calls(wire: tuple[Wire, dict[str, Any]]) -> None:
    client, init = wire
    assert init["protocolVersion"] == VERSION
    assert init["capabilities"]["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    tools = {t["name"]: t for t in client.call("tools/list")["result"]["tools"]}
    for name in ("profile_kernel", "compile_and_verify", "suggest_optimizations"):
        assert tools[name]["execution"] == {"taskSupport": "optional"}, name
    assert "execution" not in tools["job_status"]  # the job tools run directly


def test_a_task_runs_as_a_job_and_returns_the_tools_result(wire: tuple[Wire, dict[str, Any]]) -> None:
    client, _ = wire
    created = client.call("tools/call", {"name": "suggest_optimizations", "arguments": {"state_id": STATE, "k": 2},
                                         "task": {"ttl": 60000}})["result"]
    task = created["task"]
    assert task["taskId"].startswith("j_") and task["status"] in ("working", "completed") and task["ttl"] == 60000
    result = client.call("tasks/result", {"taskId": task["taskId"]})["result"]
    assert result["structuredContent"]["state_id"] == STATE and not result.get("isError")
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
    assert client.call("tasks/get", {"taskId": task["taskId"]})["result"]["status"] == "completed"
    assert task["taskId"] in [t["taskId"] for t in client.call("tasks/list")["result"]["tasks"]]
    # the same work, seen as a job
    job = client.call("tools/call", {"name": "job_status", "arguments": {"job_id": task["taskId"]}})["result"]
    assert job["structuredContent"]["status"] == "succeeded"
    finished = client.call("tasks/cancel", {"taskId": task["taskId"]})
    assert finished["error"]["code"] == -32602 and "already ended" in finished["error"]["message"]


def test_bad_arguments_and_unknown_tasks_are_errors(wire: tuple[Wire, dict[str, Any]]) -> None:
    client, _ = wire
    bad = client.call("tools/call", {"name": "suggest_optimizations", "arguments": {"k": 2}, "task": {}})["result"]
    assert bad["isError"] and "state_id" in bad["content"][0]["text"]
    unknown = client.call("tasks/get", {"taskId": "j_20000101000000_abcdef"})
    assert unknown["error"]["code"] == -32602 and "no task" in unknown["error"]["message"]
    direct = client.call("tools/call", {"name": "job_status", "arguments": {"job_id": "x"}, "task": {}})
    assert direct["error"]["code"] == -32602 and "does not run as a task" in direct["error"]["message"]


def test_a_task_failure_comes_back_as_the_tools_error(wire: tuple[Wire, dict[str, Any]]) -> None:
    client, _ = wire
    created = client.call("tools/call", {"name": "suggest_optimizations", "arguments": {"state_id": "no_such_state"},
                                         "task": {}})["result"]
    result = client.call("tasks/result", {"taskId": created["task"]["taskId"]})["result"]
    assert result["isError"] and "no_such_state" in result["content"][0]["text"]
    assert client.call("tasks/get", {"taskId": created["task"]["taskId"]})["result"]["status"] == "failed"


def test_a_task_is_its_sessions_alone(wire: tuple[Wire, dict[str, Any]]) -> None:
    """Another session (another agent on the same server) sees a task's status but not its error
    text, and cannot cancel it; the session that created it can."""
    client, _ = wire
    other = Wire(client.url)
    other.call("initialize", {"protocolVersion": VERSION, "capabilities": {},
                              "clientInfo": {"name": "other", "version": "0"}})
    other.notify("notifications/initialized")
    assert other.session and other.session != client.session
    arguments = {"state_id": "kbmcp_secretish_state"}
    created = client.call("tools/call", {"name": "suggest_optimizations", "arguments": arguments, "task": {}})["result"]
    task_id = created["task"]["taskId"]
    mine = client.call("tasks/result", {"taskId": task_id})["result"]
    assert mine["isError"] and "kbmcp_secretish_state" in mine["content"][0]["text"]
    theirs = other.call("tasks/result", {"taskId": task_id})["result"]
    assert theirs["isError"] and "kbmcp_secretish_state" not in json.dumps(theirs)
    assert "job_key" in theirs["content"][0]["text"]  # says why the text is withheld
    listed = {t["taskId"]: t for t in other.call("tasks/list")["result"]["tasks"]}
    assert "kbmcp_secretish_state" not in json.dumps(listed[task_id])
    assert "kbmcp_secretish_state" not in json.dumps(other.call("tasks/get", {"taskId": task_id})["result"])
    refused = other.call("tasks/cancel", {"taskId": task_id})
    assert refused["error"]["code"] == -32602 and "not created by this session" in refused["error"]["message"]
    ended = client.call("tasks/cancel", {"taskId": task_id})  # its creator is told it already ended
    assert "already ended" in ended["error"]["message"]
    other.http.close()


async def test_2026_clients_are_offered_no_tasks(tmp_path: Path) -> None:
    async with Client(stdio_params(tmp_path / "kb.json")) as client:
        assert client.protocol_version == "2026-07-28"
        assert client.server_capabilities.tasks is None
