"""End to end over stdio: `kb-mcp serve` spawned by the SDK's real stdio client, a wire that carries
nothing but JSON-RPC, and the banner a person sees when starting it from a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from pathlib import Path

import pytest
from hostile_candidates import HOSTILE_FLAGS
from mcp import Client

from kb_mcp.clients.mcp_client import ToolCallError, call_json, serve_command, stdio_params
from kb_mcp.server.registry import load_tools

JOB_TOOLS = {"start_job", "job_status", "cancel_job"}


async def test_real_client_over_stdio(kb_path: Path) -> None:
    async with Client(stdio_params(kb_path)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        specs = load_tools()
        assert set(tools) == {s.name for s in specs} | JOB_TOOLS
        for spec in specs:
            assert tools[spec.name].input_schema["properties"] == spec.request.model_json_schema()["properties"]
            assert tools[spec.name].output_schema is not None
            assert tools[spec.name].description == spec.description
        # titles and annotations arrive as each tool module declares them (ToolMeta)
        hints = {
            name: (tool.title, tool.annotations.read_only_hint, tool.annotations.destructive_hint,
                   tool.annotations.idempotent_hint, tool.annotations.open_world_hint)
            for name, tool in tools.items()
            if tool.annotations is not None
        }
        assert set(hints) == set(tools)
        assert hints["suggest_optimizations"] == ("Suggest optimizations for a state", True, False, True, False)
        assert hints["classify_state"] == ("Classify a profile into KB states", False, False, True, False)
        assert hints["record_outcome"] == ("Record a measured outcome in the KB", False, False, True, False)
        assert hints["compile_and_verify"][1:] == (False, False, False, False)
        assert hints["decompose_problem"] == ("Decompose a model into parts (and compose them back)", False, False,
                                              False, False)
        assert hints["profile_kernel"][1:] == (False, False, False, False)
        assert hints["job_status"][1] is True and hints["cancel_job"][2] is True
        assert all(title for title, *_ in hints.values())
        assert all(tools[name].annotations.title == hints[name][0] for name in tools)  # type: ignore[union-attr]
        states = json.loads((await client.read_resource("kb://states")).contents[0].text)  # type: ignore[union-attr]
        assert states["count"] >= 16
        one = states["states"][0]["id"]
        detail = json.loads((await client.read_resource(f"kb://state/{one}")).contents[0].text)  # type: ignore[union-attr]
        assert detail["state"]["id"] == one
        with pytest.raises(ToolCallError, match="unknown job kind"):
            await call_json(client, "start_job", {"kind": "nothing"})
    assert kb_path.exists()  # the server created and seeded the KB it was pointed at


async def test_an_unknown_tool_is_the_callers_error_naming_the_tools_there_are(kb_path: Path) -> None:
    async with Client(stdio_params(kb_path)) as client:
        names = sorted(t.name for t in (await client.list_tools()).tools)
        result = await client.call_tool("nope_tool", {})
        still_up = await client.call_tool("suggest_optimizations", {"state_id": "memory_bandwidth_saturated"})
    assert result.is_error and result.structured_content is not None
    error = result.structured_content["error"]
    assert error["whose"] == "caller" and error["type"] == "UnknownTool"
    assert error["message"] == f"no tool 'nope_tool' on this server; its tools: {', '.join(names)}"
    assert "tools/list" in error["action"]
    text = result.content[0].text  # type: ignore[union-attr]
    assert error["message"] in text and "compile_and_verify" in text
    assert not still_up.is_error  # the server stays up


def test_stdout_carries_only_json_rpc(kb_path: Path) -> None:
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw",
                                                                                        "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "job_status",
                                                                       "arguments": {"job_id": "x"}}},
        {"jsonrpc": "2.0", "id": 4, "method": "resources/read", "params": {"uri": "kb://stats"}},
    ]
    proc = subprocess.Popen(
        serve_command(kb_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("".join(json.dumps(r) + "\n" for r in requests))
    proc.stdin.flush()
    replies = []
    answered: set[int] = set()
    for line in proc.stdout:  # stdin stays open until every request is answered
        replies.append(json.loads(line))  # any log line here would fail to parse
        answered |= {replies[-1]["id"]} if "id" in replies[-1] else set()
        if answered == {1, 2, 3, 4}:
            break
    rest, stderr = proc.communicate(timeout=60)  # closes stdin: the server exits
    assert proc.returncode == 0, stderr
    replies += [json.loads(line) for line in rest.splitlines() if line.strip()]
    assert all(r.get("jsonrpc") == "2.0" for r in replies)
    by_id = {r["id"]: r for r in replies if "id" in r}
    assert set(by_id) == {1, 2, 3, 4}
    assert by_id[1]["result"]["serverInfo"]["name"] == "kb-mcp"
    assert {t["name"] for t in by_id[2]["result"]["tools"]} >= JOB_TOOLS
    assert by_id[3]["result"]["isError"] is True
    assert str(kb_path) in by_id[4]["result"]["contents"][0]["text"]
    assert "serving" in stderr and str(kb_path) in stderr  # logs went to stderr


def test_started_from_a_terminal_it_says_what_it_serves_and_how_to_connect(kb_path: Path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(serve_command(kb_path), stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    os.close(slave)
    try:
        assert proc.stderr is not None
        seen = ""
        for line in proc.stderr:
            seen += line
            if line.startswith("serving MCP on stdin/stdout"):
                break
    finally:
        os.close(master)
        proc.kill()
        proc.wait(10)
    assert f"KB: {kb_path}" in seen
    assert "states" in seen and "optimizations" in seen
    assert "tools: " in seen and "job_status" in seen
    assert "GPU:" in seen
    assert f"claude mcp add kb-mcp -- kb-mcp --kb {kb_path} serve" in seen
    assert ".cursor/mcp.json" in seen and ".vscode/mcp.json" in seen


def test_a_corrupt_kb_is_refused_at_start_and_left_alone(kb_path: Path) -> None:
    kb_path.write_text("{ this is not json")
    done = subprocess.run(serve_command(kb_path), input="", capture_output=True, text=True, timeout=60)
    assert done.returncode == 3  # the environment's fault
    assert f"cannot open the KB {kb_path}" in done.stderr
    assert kb_path.read_text() == "{ this is not json"
    assert done.stdout == ""


def _exchange(command: list[str], requests: list[dict], last_id: int) -> tuple[dict[int, dict], str]:
    """Sends raw JSON-RPC to a stdio server until `last_id` is answered; (replies by id, its stderr)."""
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("".join(json.dumps(r) + "\n" for r in requests))
    proc.stdin.flush()
    by_id: dict[int, dict] = {}
    for line in proc.stdout:
        reply = json.loads(line)
        by_id[reply.get("id", -1)] = reply
        if last_id in by_id:
            break
    _rest, stderr = proc.communicate(timeout=120)
    return by_id, stderr


@pytest.mark.nvcc
def test_each_attempt_is_logged_with_the_clients_name(kb_path: Path, tmp_path: Path) -> None:
    """A candidate's refused compiler flags are its attempt: the verdict is flagged with the finding,
    and the server's log names the client whose call it was."""
    candidate = tmp_path / "tricky.py"
    candidate.write_text(HOSTILE_FLAGS)
    problem = Path(__file__).resolve().parents[2] / "examples" / "problems" / "swish.py"
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "agent-mallory", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "compile_and_verify",
            "arguments": {"problem": str(problem), "candidate": str(candidate), "options": {"compile_only": True}}}},
    ]
    by_id, stderr = _exchange(serve_command(kb_path), requests, 2)
    result = by_id[2]["result"]["structuredContent"]
    assert result["record"]["verdict"] == "compile_error" and result["record"]["flagged"], result
    assert any(f["code"] == "sandbox_attempt" and "-wrapper" in f["message"] for f in result["findings"]), result
    assert "sandbox attempt by agent-mallory: build: tricky: CUDA compiler flag -wrapper" in stderr, stderr


@pytest.mark.nvcc
def test_serve_attempts_invalid_rejects_such_a_verdict(kb_path: Path, tmp_path: Path) -> None:
    candidate = tmp_path / "tricky.py"
    candidate.write_text(HOSTILE_FLAGS)
    problem = Path(__file__).resolve().parents[2] / "examples" / "problems" / "swish.py"
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "a", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "compile_and_verify",
            "arguments": {"problem": str(problem), "candidate": str(candidate), "options": {"compile_only": True}}}},
    ]
    by_id, stderr = _exchange(serve_command(kb_path, ["--attempts", "invalid"]), requests, 2)
    result = by_id[2]["result"]["structuredContent"]
    assert result["record"]["verdict"] == "invalid", result
    assert result["summary"].startswith("invalid (sandbox_attempt)") and "-wrapper" in result["record"]["attempt"]
    assert "sandbox attempts: verdicts are invalid" in stderr


# Settings every call (or every verdict) would be refused for, and words of the refusal at start.
REFUSED_AT_START = {
    "KB_MCP_ATTEMPTS": ("ignore", "$KB_MCP_ATTEMPTS='ignore' is not one of 'flag', 'invalid'"),
    "KB_MCP_MAX_TIMEOUT_S": ("0", "$KB_MCP_MAX_TIMEOUT_S='0' is not a number of seconds, more than 0"),
    "KB_MCP_MAX_COMPILE_TIMEOUT_S": ("nan", "$KB_MCP_MAX_COMPILE_TIMEOUT_S='nan' is not a number of seconds"),
    "KB_MCP_PROFILE_STANDBY": ("maybe", "$KB_MCP_PROFILE_STANDBY='maybe' is not one of"),
    "KB_MCP_WATCH": ("disabled", "$KB_MCP_WATCH='disabled' is not one of"),
    "KB_MCP_CAMPAIGN_MAX_PROBLEMS": ("0", "$KB_MCP_CAMPAIGN_MAX_PROBLEMS='0' is not a whole number, more than 0"),
    "KB_MCP_CAMPAIGN_MAX_ITERATIONS": ("-1", "$KB_MCP_CAMPAIGN_MAX_ITERATIONS='-1' is not a whole number"),
    "KB_MCP_CAMPAIGN_MAX_STEPS": ("1e3", "$KB_MCP_CAMPAIGN_MAX_STEPS='1e3' is not a whole number"),
    "KB_MCP_CAMPAIGN_MAX_ATTEMPTS": ("ten", "$KB_MCP_CAMPAIGN_MAX_ATTEMPTS='ten' is not a whole number"),
    "KB_MCP_CAMPAIGN_MAX_PARALLEL": ("2.5", "$KB_MCP_CAMPAIGN_MAX_PARALLEL='2.5' is not a whole number"),
}


@pytest.mark.parametrize("variable", sorted(REFUSED_AT_START))
def test_a_setting_the_server_cannot_use_is_refused_at_start_by_name(kb_path: Path, variable: str) -> None:
    value, said = REFUSED_AT_START[variable]
    done = subprocess.run(serve_command(kb_path), input="", capture_output=True, text=True, timeout=60,
                          env={**os.environ, variable: value})
    assert done.returncode == 3 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "unset it for the default" in done.stderr
    assert not kb_path.exists()  # refused before the KB is opened (or created)


def test_the_attempts_flag_stands_in_for_a_wrong_attempts_setting(kb_path: Path) -> None:
    done = subprocess.run(serve_command(kb_path, ["--attempts", "flag"]), input="", capture_output=True, text=True,
                          timeout=60, env={**os.environ, "KB_MCP_ATTEMPTS": "ignore"})
    assert done.returncode == 0 and "sandbox attempts: verdicts are flagged" in done.stderr, done.stderr
