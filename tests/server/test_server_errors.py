"""Every failure says whose it is, over the real stdio protocol: the caller's mistake, the
environment's fault (KB file, lock, permissions, input encoding) and a kb-mcp bug each arrive as an
`isError` result with their own wording and structured content `{"error": ErrorInfo}`."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from kb_mcp.kb.models import CandidateRecord, Verdict
from kb_mcp.kb.store import KBStore

TOY_STDIO = Path(__file__).with_name("toy_stdio.py")


@asynccontextmanager
async def _client(kb: Path, log: Path, env: dict[str, str] | None = None):
    params = StdioServerParameters(command=sys.executable, args=[str(TOY_STDIO), str(kb), str(log)],
                                   env={**os.environ, **(env or {})})
    async with Client(params) as client:
        yield client


async def _error(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result
    assert result.structured_content is not None and "error" in result.structured_content
    return result.content[0].text, result.structured_content["error"]  # type: ignore[union-attr]


def _recorded_candidate(kb: Path) -> str:
    with KBStore.open(kb).transaction() as tx:
        tx.put_candidate(CandidateRecord(candidate_id="c_1", problem="p", problem_hash="h", verdict=Verdict.faster,
                                         arch="sm_90", time_ms=1.0, eager_ms=2.0))
    return "c_1"


async def test_the_callers_mistakes(kb_path: Path, tmp_path: Path) -> None:
    async with _client(kb_path, tmp_path / "log") as client:
        text, err = await _error(client, "toy_count", {"n": "many"})
        assert err["whose"] == "caller" and text.startswith("invalid arguments for toy_count")
        text, err = await _error(client, "toy_count", {"n": 2, "fail": "tool_error"})
        assert err == {"whose": "caller", "type": "ToolError", "message": err["message"]} and "fail='none'" in text
        text, err = await _error(client, "suggest_optimizations", {"state_id": "no_such_state"})
        assert err["whose"] == "caller" and "no_such_state" in text


async def test_a_damaged_journal_is_the_environments_fault_with_where_and_what_to_do(kb_path: Path,
                                                                                     tmp_path: Path) -> None:
    _recorded_candidate(kb_path)
    journal = Path(str(kb_path) + ".journal")
    data = bytearray(journal.read_bytes())
    data[30] ^= 0x01
    journal.write_bytes(bytes(data))
    async with _client(kb_path, tmp_path / "log") as client:  # a server started before the damage sees it too
        text, err = await _error(client, "suggest_optimizations", {"state_id": "memory_bandwidth_saturated"})
    assert err["whose"] == "environment" and err["type"] == "KBCorruptError" and err["where"] == str(journal)
    assert "kb repair" in err["action"] and "line 1 (byte offset 0)" in err["message"]
    assert "not in your arguments" in text and "operator" in text and "bug" not in text


async def test_a_read_only_kb_refuses_the_write_in_words(kb_path: Path, tmp_path: Path) -> None:
    cid = _recorded_candidate(kb_path)
    os.chmod(kb_path, 0o444)
    async with _client(kb_path, tmp_path / "log") as client:
        text, err = await _error(client, "record_outcome", {"state_id": "memory_bandwidth_saturated",
                                                             "optimization_id": "vectorize_global_access",
                                                             "candidate_id": cid})
        ok = await client.call_tool("suggest_optimizations", {"state_id": "memory_bandwidth_saturated"})
    assert err["whose"] == "environment" and err["type"] == "KBReadOnlyError" and err["where"] == str(kb_path)
    assert "read-only" in text and "chmod u+w" in text
    assert not ok.is_error  # reads still work


async def test_a_lock_held_too_long_names_its_holder(kb_path: Path, tmp_path: Path) -> None:
    cid = _recorded_candidate(kb_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from kb_mcp.kb.store import KBStore\n"
         "with KBStore.open(sys.argv[1]).transaction():\n print('held', flush=True); time.sleep(3600)",
         str(kb_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        async with _client(kb_path, tmp_path / "log", {"KB_MCP_LOCK_TIMEOUT": "1"}) as client:
            text, err = await _error(client, "record_outcome", {"state_id": "memory_bandwidth_saturated",
                                                                 "optimization_id": "vectorize_global_access",
                                                                 "candidate_id": cid})
    finally:
        holder.kill()
        holder.communicate(timeout=30)
    assert err["whose"] == "environment" and err["type"] == "KBLockTimeout"
    assert f"pid {holder.pid}" in text and f"kill {holder.pid}" in text and "Do not delete the lock file" in text


async def test_an_input_file_that_is_not_utf8_is_named(kb_path: Path, tmp_path: Path) -> None:
    problem = tmp_path / "latin1_problem.py"
    problem.write_bytes("# caf\xe9\nimport torch\n".encode("latin-1"))
    async with _client(kb_path, tmp_path / "log") as client:
        text, err = await _error(client, "compile_and_verify", {"problem": str(problem), "candidate": "x = 1\n"})
    assert err["whose"] == "environment" and err["type"] == "InputEncodingError" and err["where"] == str(problem)
    assert "byte 0xe9 at offset 5" in text and "UTF-8" in text
    # one fix, the operator's: the file saved as UTF-8 (not other arguments, which the text says will not help)
    assert f"The operator can fix it: save {problem} as UTF-8" in text and "pass its text" not in text


async def test_a_bug_says_so_and_the_log_has_its_traceback_under_the_incident_id(kb_path: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    async with _client(kb_path, log) as client:
        text, err = await _error(client, "toy_count", {"n": 4, "fail": "crash"})
        again = await client.call_tool("toy_count", {"n": 2})  # the server lives on
    assert err["whose"] == "kb-mcp" and err["type"] == "ZeroDivisionError" and len(err["incident"]) == 8
    assert "bug in kb-mcp" in text and err["incident"] in text and "not because of your arguments" in text
    logged = log.read_text()
    assert f"incident {err['incident']}" in logged and "Traceback" in logged and "ZeroDivisionError" in logged
    assert not again.is_error


@pytest.mark.parametrize("whose, code", [("caller", 1), ("environment", 3)])
def test_kb_mcp_call_exits_by_whose_the_failure_is(kb_path: Path, whose: str, code: int) -> None:
    KBStore.open(kb_path)
    if whose == "environment":
        os.chmod(kb_path, 0o444)
    args = ["record_outcome", "--arg", "state_id=memory_bandwidth_saturated",
            "--arg", "optimization_id=vectorize_global_access", "--arg", "candidate_id=c_unknown"]
    done = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb_path), "call", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert ("read-only" if whose == "environment" else "unknown candidate_id") in done.stderr


def test_a_deleted_kb_is_refused_by_serve_and_call_and_not_recreated(kb_path: Path) -> None:
    with KBStore.open(kb_path).transaction() as tx:
        tx.put_candidate(CandidateRecord(candidate_id="c_1", problem="p", problem_hash="h", verdict=Verdict.faster))
    kb_path.unlink()  # an accidental rm: the journal is still there
    serve = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb_path), "serve"], input="",
                           capture_output=True, text=True, timeout=120)
    call = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb_path), "call",
                           "suggest_optimizations", "--arg", "state_id=memory_bandwidth_saturated"],
                          capture_output=True, text=True, timeout=120)
    for done in (serve, call):
        assert done.returncode == 3, done.stderr
        assert "is missing" in done.stderr and "journal" in done.stderr and "kb init" in done.stderr
        assert "Traceback" not in done.stderr
    assert not kb_path.exists()


def test_any_command_meeting_a_kb_error_it_does_not_word_itself_exits_by_whose(monkeypatch, capsys) -> None:
    from kb_mcp.kb.errors import KBMissingError
    from kb_mcp.server import cli, cmd_serve

    def fails(args: object) -> int:
        raise KBMissingError("no KB file at /x/kb.json", where="/x/kb.json", action="create one with `kb init`")

    monkeypatch.setattr(cmd_serve, "run", fails)
    assert cli.main(["serve"]) == 3
    assert capsys.readouterr().err.strip() == "kb-mcp serve: no KB file at /x/kb.json. Create one with `kb init`"
