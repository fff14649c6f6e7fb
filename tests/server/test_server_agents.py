"""The agents of a shared HTTP server, told apart by a token each (`server.agents`): what an agents file
may hold, and, over a spawned `kb-mcp serve --http --agents-file` with real MCP clients, that each
agent is a client of its own to the KB (the only verifier of what it verifies, the name on what it
records) and has its own share of the job slots whatever session it uses."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from hostile_candidates import HOSTILE_FLAGS
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import Implementation
from serverproc import endpoint_that_never_answers, http_server, run_cli, session_client

from kb_mcp.clients.mcp_client import ToolCallError, call_json, connect_http
from kb_mcp.kb.store import KBStore
from kb_mcp.server.agents import Agent, AgentsFile, Credentials, parse_agents, read_agents

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SWISH = EXAMPLES / "problems" / "swish.py"
SHARED = "shared-token-for-tests-0123456789"
ALICE = "alice-token-for-tests-0123456789"
BOB = "bob-token-for-tests-01234567890ab"
STATE = "memory_bandwidth_saturated"
OPT = "fuse_elementwise_chain"


def _agents_file(tmp_path: Path, text: str = f"# NAME TOKEN\nalice {ALICE}\n\n  bob\t{BOB}  \n") -> Path:
    path = tmp_path / "agents"
    path.write_text(text)
    path.chmod(0o600)
    return path


# ---- the agents file ------------------------------------------------------------------------------------


def test_an_agents_file_names_each_agent_with_its_token() -> None:
    agents = parse_agents(f"# NAME TOKEN\nalice {ALICE}\n\n  bob\t{BOB}  \n", "f")
    assert [(a.name, a.client) for a in agents] == [("alice", "agent:alice"), ("bob", "agent:bob")]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (f"alice {ALICE} extra\n", "line 1: expected 'NAME TOKEN'"),
        ("alice\n", "line 1: expected 'NAME TOKEN'"),
        (f"al/ice {ALICE}\n", "line 1: the agent name 'al/ice' is not"),
        (f"-alice {ALICE}\n", "the agent name '-alice' is not"),
        (f"{'a' * 41} {ALICE}\n", "is not 1-40 letters"),
        (f"alice {ALICE}\n# x\nalice {BOB}\n", "line 3: the agent 'alice' is already named on line 1"),
        (f"alice {ALICE}\nbob {ALICE}\n", "line 2: bob's token is also the token on line 1"),
        ("alice short-token\n", "line 1: alice's token is too short (11 characters)"),
        ("alice ${ALICE_TOKEN}\n", "alice's token is the unexpanded text '${ALICE_TOKEN}'"),
        (f"alice {SHARED}\n", "alice's token is the shared token"),
        ("# only a comment\n\n", "names no agent"),
        (f"alice {ALICE}\nAlice {BOB}\n", "line 2: the agent 'Alice' is already named on line 1 (names that differ "
                                           "only in case"),
        ("alice caf\u00e9-token-for-tests-0123\n", "alice's token holds the character 'é' (U+00E9), which no client "
                                                   "can send"),
        ("alice tab\x01token-for-tests-0123\n", "alice's token holds the character '\\x01'"),
        (f"alice {ALICE}\x0bbob {BOB}\n", "line 1: expected 'NAME TOKEN' (two fields separated by spaces), found 4"),
        (f"alice {ALICE}\n\u2028\nalice {BOB}\n", "line 3: the agent 'alice' is already named on line 1"),
    ],
)
def test_a_bad_agents_file_is_refused_with_its_line_and_never_its_token(text: str, words: str) -> None:
    with pytest.raises(ValueError, match="the agents file F") as refused:
        parse_agents(text, "the agents file F", shared=SHARED)
    assert words in str(refused.value)
    for token in (ALICE, BOB, SHARED):
        assert token not in str(refused.value)


def test_the_agents_file_comes_from_the_option_else_the_environment(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KB_MCP_AGENTS", raising=False)
    assert read_agents(None) is None
    path = _agents_file(tmp_path)
    monkeypatch.setenv("KB_MCP_AGENTS", str(path))
    from_env = read_agents(None)
    assert from_env is not None and [a.name for a in from_env.agents()] == ["alice", "bob"]
    with pytest.raises(ValueError, match=f"cannot read the agents file {tmp_path / 'missing'}"):
        read_agents(str(tmp_path / "missing"))


def test_an_agents_file_others_may_read_is_warned_of(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _agents_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="kb_mcp.server.agents"):
        read_agents(str(path))
    assert not caplog.records
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="kb_mcp.server.agents"):
        read_agents(str(path))
    assert f"chmod 600 {path}" in caplog.text


def test_an_agents_token_is_never_shown(tmp_path: Path) -> None:
    assert ALICE not in repr(Agent("alice", ALICE))
    agents = AgentsFile(_agents_file(tmp_path))
    assert ALICE not in repr(Credentials(SHARED, agents)) + repr(agents)


def test_an_edited_agents_file_takes_effect_at_once_and_a_bad_edit_admits_no_agent(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _agents_file(tmp_path)
    tokens = Credentials(SHARED, AgentsFile(path))
    assert tokens.client_of(BOB) == "agent:bob"
    carol = "carol-token-for-tests-0123456789"
    path.write_text(f"alice {ALICE}\ncarol {carol}\n")  # bob revoked, carol added: no restart
    assert (tokens.client_of(BOB), tokens.client_of(carol), tokens.client_of(ALICE)) == (None, "agent:carol",
                                                                                          "agent:alice")
    with caplog.at_level(logging.INFO, logger="kb_mcp.server.agents"):
        path.write_text(f"alice {ALICE}\nbob {ALICE} oops\n")  # a mistake: nobody of the file is let in
        assert tokens.client_of(ALICE) is None and tokens.client_of(SHARED) == "mcp-http"
        assert "line 2: expected 'NAME TOKEN'" in caplog.text and "no agent's token is accepted" in caplog.text
        assert ALICE not in caplog.text
        path.unlink()  # nor while the file is gone
        assert tokens.client_of(ALICE) is None and "cannot read the agents file" in caplog.text
        path.write_text(f"alice {ALICE}\n")
        assert tokens.client_of(ALICE) == "agent:alice" and "changed: 1 agents (alice)" in caplog.text
    assert tokens.required


def test_serve_refuses_an_agents_file_without_http_or_with_a_mistake(kb_path: Path, tmp_path: Path) -> None:
    stdio = run_cli(["--kb", str(kb_path), "serve", "--agents-file", str(_agents_file(tmp_path))])
    assert stdio.returncode == 2 and "--agents-file applies to --http only" in stdio.stderr
    bad = _agents_file(tmp_path, f"alice {ALICE}\nbob {ALICE}\n")
    refused = run_cli(["--kb", str(kb_path), "serve", "--http", "127.0.0.1:0", "--agents-file", str(bad)])
    assert refused.returncode == 1 and "line 2: bob's token is also the token on line 1" in refused.stderr
    assert ALICE not in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize("kind", ["folder", "pipe"])
def test_serve_refuses_an_agents_file_that_is_no_regular_file_at_once(kb_path: Path, tmp_path: Path,
                                                                      kind: str) -> None:
    path = tmp_path / "agents"
    if kind == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)  # no writer: reading it would wait for ever
    refused = run_cli(["--kb", str(kb_path), "serve", "--http", "127.0.0.1:0", "--agents-file", str(path)],
                      timeout=30)
    assert refused.returncode == 1, refused.stderr  # the caller's: the path names no agents file
    assert f"the agents file {path} is not a regular file" in refused.stderr and "Traceback" not in refused.stderr


def test_an_agents_file_that_is_not_utf8_is_refused_in_words(tmp_path: Path) -> None:
    path = tmp_path / "agents"
    path.write_bytes(b"alice \xff" + ALICE.encode() + b"\n")
    with pytest.raises(ValueError, match=f"cannot read the agents file {path}: it is not UTF-8 text"):
        read_agents(str(path))


# ---- over HTTP ------------------------------------------------------------------------------------------


async def test_each_agent_is_a_client_of_its_own_to_the_kb(kb_path: Path, tmp_path: Path) -> None:
    args = ["--http", "127.0.0.1:0", "--agents-file", str(_agents_file(tmp_path))]
    with http_server(kb_path, args, env={"KB_MCP_TOKEN": SHARED}) as server:
        said = " ".join(server.stderr.split())
        assert "bearer token required: the shared token or 2 agents' own tokens (alice, bob; " in said
        assert "is read again when it changes)" in said
        async with connect_http(server.url, ALICE) as alice, connect_http(server.url, BOB) as bob, \
                connect_http(server.url, SHARED) as shared:
            verified = await call_json(alice, "compile_and_verify", {"problem": SWISH.read_text(),
                                                                     "candidate": "class ModelNew: pass  # alice's\n"})
            cid = verified["record"]["candidate_id"]
            for other in (bob, shared):  # neither another agent nor the shared token's clients are alice
                with pytest.raises(ToolCallError, match="verified by another client"):
                    await call_json(other, "record_outcome", {"state_id": STATE, "optimization_id": OPT,
                                                              "candidate_id": cid, "lesson": "bob was here"})
            recorded = await call_json(alice, "record_outcome", {"state_id": STATE, "optimization_id": OPT,
                                                                 "candidate_id": cid})
            assert recorded["recorded"], recorded
        (tmp_path / "agents").write_text(f"alice {ALICE}\n")  # bob revoked while the server runs
        for revoked in ("nobody-token-0123456789abcdef", BOB):  # refused before any tool runs
            with pytest.raises(Exception):  # noqa: B017
                async with connect_http(server.url, revoked) as nobody:
                    await call_json(nobody, "suggest_optimizations", {"state_id": STATE})
        async with connect_http(server.url, ALICE) as alice:
            assert (await call_json(alice, "suggest_optimizations", {"state_id": STATE}))["suggestions"]
    with KBStore.open(kb_path).read() as view:
        assert [v.verified_by for v in view.candidate_verdicts(cid)] == [["agent:alice"]]
        assert [o.agent for o in view.outcomes_for_candidate(cid)] == ["agent:alice"]
    for token in (ALICE, BOB, SHARED):
        assert token not in server.stderr


def test_the_banner_of_a_server_of_agents_tokens_alone_connects_agents_with_their_token(kb_path: Path,
                                                                                       tmp_path: Path) -> None:
    """Each agent sets its own token as its KB_MCP_TOKEN (docs/agents.md): the connect lines send it, as they
    send the shared one, so an agent following them is not refused for sending none."""
    args = ["--http", "127.0.0.1:0", "--agents-file", str(_agents_file(tmp_path))]
    with http_server(kb_path, args, env={"KB_MCP_TOKEN": ""}) as server:
        said = server.stderr
    assert "bearer token required: 2 agents' own tokens (alice, bob;" in " ".join(said.split())
    claude = next(line for line in said.splitlines() if "Claude Code:" in line)
    assert claude.endswith(f'{server.url} --header "Authorization: Bearer $KB_MCP_TOKEN"'), claude
    for host in ("Cursor", "VS Code"):
        line = next(line for line in said.splitlines() if f"{host} (" in line)
        assert '"headers": {"Authorization": "Bearer ${env:KB_MCP_TOKEN}"}' in line, line


async def test_an_agents_jobs_count_towards_its_own_cap_whatever_its_session(kb_path: Path, tmp_path: Path) -> None:
    """Alice's campaign in one session is hers in every other and on the sessionless protocol: her
    second is refused, saying why and what to do, and bob's campaign still finds a slot (before, alice
    could hold both campaign slots, and bob's waited queued for as long as hers stalled)."""
    campaign = {"kind": "run_campaign", "arguments": {"problems": [str(SWISH)], "compile_only": True}}

    def named(name: str) -> dict[str, object]:
        return {**campaign, "arguments": {**campaign["arguments"], "name": name}}  # type: ignore[dict-item]

    with endpoint_that_never_answers() as (url, _held):
        env = {"KB_MCP_LLM_MODEL": "x", "KB_MCP_LLM_MAX_RETRIES": "0", "KB_MCP_LLM_BASE_URL": url,
               "KB_MCP_FILES": str(SWISH.parent), "KB_MCP_TOKEN": ""}
        args = ["--http", "127.0.0.1:0", "--agents-file", str(_agents_file(tmp_path))]
        with http_server(kb_path, args, env=env) as server:
            async with session_client(server.url, ALICE) as first, session_client(server.url, ALICE) as second:
                await call_json(first, "start_job", named("alices"))
                for client in (first, second):  # a new session does not make alice someone else
                    with pytest.raises(ToolCallError, match=r"MAX_LONG_JOBS_PER_SUBMITTER=1.*campaigns still find "
                                                            r"one of the 2 slots.*cancel_job"):
                        await call_json(client, "start_job", named("one-more"))
                async with connect_http(server.url, ALICE) as sessionless:  # nor does a protocol without one
                    with pytest.raises(ToolCallError, match="MAX_LONG_JOBS_PER_SUBMITTER"):
                        await call_json(sessionless, "start_job", named("sessionless"))
                async with connect_http(server.url, BOB) as bob:  # bob's share is his own
                    job = await call_json(bob, "start_job", named("bobs"))
                    view = await call_json(bob, "job_status", {"job_id": job["job_id"], "job_key": job["job_key"]})
                    for _ in range(60):
                        if view["status"] != "queued":
                            break
                        await anyio.sleep(0.25)
                        view = await call_json(bob, "job_status", {"job_id": job["job_id"]})
                    quick = await call_json(bob, "start_job", {"kind": "suggest_optimizations",
                                                               "arguments": {"state_id": STATE}})
                    done = await call_json(bob, "job_status", {"job_id": quick["job_id"], "wait_s": 30})
    assert view["status"] == "running", view
    assert done["status"] == "succeeded", done


def test_an_agent_refused_while_the_agents_file_is_broken_is_told_it_is_the_operators_to_fix(
        kb_path: Path, tmp_path: Path) -> None:
    path = _agents_file(tmp_path)
    args = ["--http", "127.0.0.1:0", "--agents-file", str(path)]
    with http_server(kb_path, args, env={"KB_MCP_TOKEN": SHARED}) as server, httpx2.Client(timeout=30) as http:
        def refusal(token: str) -> str:
            answer = http.post(server.url, json={}, headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 401, answer.text
            return str(answer.json()["error_description"])

        path.write_text(f"alice {ALICE}\nbob {ALICE}\n")  # a mistake while the server runs
        for token in (ALICE, "not-a-token-of-anyone-0123456789"):
            said = refusal(token)
            assert "agents file cannot be used since its last change (the operator's to fix)" in said, said
            assert "line 2" not in said and ALICE not in said  # what is wrong is the operator's log's
        path.write_text(f"alice {ALICE}\n")
        assert "check the token your client sends" in refusal(BOB)  # a file that works: the token is wrong
    assert "line 2: bob's token is also the token on line 1" in server.stderr


def _rpc(http: httpx2.Client, url: str, token: str, session: str, method: str,
         params: dict[str, Any]) -> tuple[int, dict[str, Any], str]:
    """One JSON-RPC request of the 2025-11-25 protocol, sent with `token` in `session` ('' opens one):
    (HTTP status, the answer or {}, the session id the server names)."""
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {token}"}
    if session:
        headers |= {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    response = http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=headers)
    answer: dict[str, Any] = {}
    if response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream"):
        answer = next(json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:"))
    elif response.status_code == 200:
        answer = response.json()
    return response.status_code, answer, response.headers.get("mcp-session-id", session)


def test_an_agents_session_is_no_one_elses_even_with_its_id(kb_path: Path, tmp_path: Path) -> None:
    """Another agent that learns an agent's Mcp-Session-Id (a log, a proxy) cannot use the session:
    not to read its task's private text, not to cancel its tasks."""
    args = ["--http", "127.0.0.1:0", "--agents-file", str(_agents_file(tmp_path))]
    with http_server(kb_path, args, env={"KB_MCP_TOKEN": SHARED}) as server, httpx2.Client(timeout=60) as http:
        _, _, session = _rpc(http, server.url, ALICE, "", "initialize", {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "alice", "version": "0"}})
        http.post(server.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                  headers={"Authorization": f"Bearer {ALICE}", "Mcp-Session-Id": session,
                           "MCP-Protocol-Version": "2025-11-25", "Accept": "application/json, text/event-stream"})
        _, created, _ = _rpc(http, server.url, ALICE, session, "tools/call", {
            "name": "suggest_optimizations", "arguments": {"state_id": "alices_private_state"}, "task": {}})
        task = {"taskId": created["result"]["task"]["taskId"]}
        _, mine, _ = _rpc(http, server.url, ALICE, session, "tasks/result", task)
        assert "alices_private_state" in json.dumps(mine)  # alice's own session sees her task's text
        for token in (BOB, SHARED):
            for method in ("tasks/result", "tasks/cancel", "tools/list"):
                status, answer, _ = _rpc(http, server.url, token, session, method, task if "tasks" in method else {})
                assert status == 404 and "alices_private_state" not in json.dumps(answer), (token[:3], method, answer)
        assert _rpc(http, server.url, ALICE, session, "tasks/get", task)[0] == 200  # and her session goes on


@pytest.mark.nvcc
async def test_a_sandbox_attempt_is_logged_for_who_the_token_says_not_the_name_a_client_gives_itself(
        kb_path: Path, tmp_path: Path) -> None:
    """A holder of the shared token that calls itself `agent:alice` is logged as the shared client
    (its own name only quoted), so the operator does not revoke alice; an agent's task is logged as
    that agent, as its tool calls are."""
    verify = {"problem": SWISH.read_text(), "candidate": HOSTILE_FLAGS, "options": {"compile_only": True}}
    args = ["--http", "127.0.0.1:0", "--agents-file", str(_agents_file(tmp_path))]
    with http_server(kb_path, args, env={"KB_MCP_TOKEN": SHARED}) as server:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {SHARED}"},
                                      timeout=httpx2.Timeout(30.0, read=300.0)) as http:
            async with Client(streamable_http_client(server.url, http_client=http), mode="legacy",
                              client_info=Implementation(name="agent:alice", version="0")) as posing:
                await call_json(posing, "compile_and_verify", verify)
        with httpx2.Client(timeout=300) as http:
            _, _, session = _rpc(http, server.url, BOB, "", "initialize", {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bob", "version": "0"}})
            _, created, _ = _rpc(http, server.url, BOB, session, "tools/call",
                                 {"name": "compile_and_verify", "arguments": verify, "task": {}})
            _rpc(http, server.url, BOB, session, "tasks/result", {"taskId": created["result"]["task"]["taskId"]})
        log = server.stderr
    assert "sandbox attempt by mcp-http (calls itself 'agent:alice'): build: tricky" in log, log
    assert "sandbox attempt by agent:alice" not in log, log
    assert "sandbox attempt by agent:bob (calls itself 'bob'): build: tricky" in log, log


@pytest.mark.nvcc
async def test_a_campaign_an_agent_starts_verifies_as_that_agent(kb_path: Path, tmp_path: Path) -> None:
    from fakellm import FakeLLMServer
    from fakellm.campaign_script import campaign_script

    with FakeLLMServer(campaign_script()) as llm:
        env = {"KB_MCP_LLM_MODEL": "fake-model", "KB_MCP_LLM_BASE_URL": llm.base_url, "KB_MCP_TOKEN": "",
               "KB_MCP_FILES": str(SWISH.parent)}
        args = ["--http", "127.0.0.1:0", "--agents-file", str(_agents_file(tmp_path))]
        with http_server(kb_path, args, env=env) as server:
            async with connect_http(server.url, ALICE) as alice:
                job = await call_json(alice, "start_job", {"kind": "run_campaign", "arguments": {
                    "problems": [str(SWISH)], "name": "alices", "compile_only": True, "iterations": 1, "steps": 2,
                    "gradient_every": 0}})
                view = job
                for _ in range(40):
                    view = await call_json(alice, "job_status", {"job_id": job["job_id"], "job_key": job["job_key"],
                                                                 "wait_s": 10})
                    if view["status"] not in ("queued", "running"):
                        break
    assert view["status"] == "succeeded", view
    with KBStore.open(kb_path).read() as kb:
        verdicts = kb.list_candidates()
        agents = {o.agent for o in kb.outcomes()}
    assert verdicts and {tuple(v.verified_by) for v in verdicts} == {("agent:alice",)}  # its rollouts are alice's
    assert agents <= {"agent:alice"}
