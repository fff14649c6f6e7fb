"""Hostile candidates and problems after the server's secrets: a secret planted in the server's
environment must never appear in any result, stored verdict, artifact or job record, whether the
code prints it, encodes it or raises with it; and a client reading a job without its key sees none
of the submitter's output or exception text. Real stdio servers, real worker processes, the CPU
compile-only path (nvcc) and the problem-import path."""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path

import pytest
from mcp import Client

from kb_mcp.clients.mcp_client import ToolCallError, call_json, stdio_params

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples" / "problems" / "swish.py"
CANDIDATE = ROOT / "examples" / "candidates" / "swish_nvrtc.py"
NAME = "ACME_API_KEY"
NOT_VISIBLE = "secret-not-visible-here"

# Prints the secret plainly, base64- and hex-encoded, then raises with it, at import. The compile-only
# path never imports a candidate (its verdict stays needs_gpu); a problem is imported in the sandbox,
# whose environment holds no secret; the redaction below is the layer behind both.
LEAK = f'''
import base64, os, sys
_s = os.environ.get("{NAME}", "")
if not _s:
    print("{NOT_VISIBLE}")
print("key:", _s, base64.b64encode(_s.encode()).decode(), _s.encode().hex())
print("again", _s, file=sys.stderr)
'''


def _forms(secret: str) -> list[str]:
    raw = secret.encode()
    return [secret, raw.hex(), base64.b64encode(raw).decode().rstrip("=")[:-2]]


def _files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def _assert_nowhere(secret: str, texts: list[str], folder: Path) -> None:
    for form in _forms(secret):
        for text in texts:
            assert form not in text, f"{form!r} leaked into a result: {text[:2000]}"
        for path in _files_under(folder):
            assert form.encode() not in path.read_bytes(), f"{form!r} leaked into {path}"


@pytest.mark.nvcc
async def test_a_planted_secret_never_leaves_the_server(tmp_path: Path) -> None:
    secret = "sk-acme-" + secrets.token_hex(16)
    kb = tmp_path / "shared" / "kb.json"
    env = {NAME: secret, "CUDA_VISIBLE_DEVICES": ""}
    raising = CANDIDATE.read_text().replace("\n\nclass ModelNew",
                                            f"\n{LEAK}\nraise RuntimeError('leaking ' + _s)\n\nclass ModelNew", 1)
    printing = CANDIDATE.read_text().replace("\n\nclass ModelNew", f"\n{LEAK}\n\nclass ModelNew", 1)
    problem = tmp_path / "leaky_problem.py"
    problem.write_text(PROBLEM.read_text() + f"\n{LEAK}\nraise ValueError('problem leaks ' + _s)\n")
    texts: list[str] = []

    async with Client(stdio_params(kb, env=env)) as client:
        crashed = await call_json(client, "compile_and_verify", {"problem": str(PROBLEM), "candidate": raising})
        shown = await call_json(client, "compile_and_verify", {"problem": str(PROBLEM), "candidate": printing,
                                                               "detail": True})
        with pytest.raises(ToolCallError) as problem_error:
            await call_json(client, "compile_and_verify", {"problem": str(problem), "candidate": printing})
        job = await call_json(client, "start_job", {"kind": "compile_and_verify",
                                                    "arguments": {"problem": str(PROBLEM), "candidate": raising}})
        mine = await call_json(client, "job_status", {"job_id": job["job_id"], "job_key": job["job_key"],
                                                      "wait_s": 100})
        same_session_no_key = await call_json(client, "job_status", {"job_id": job["job_id"]})
        texts += [json.dumps(x) for x in (crashed, shown, mine, same_session_no_key)] + [str(problem_error.value)]

    # another client (its own server process on the same KB) reads the job without its key
    async with Client(stdio_params(kb)) as other:
        theirs = await call_json(other, "job_status", {"job_id": job["job_id"]})
        with_key = await call_json(other, "job_status", {"job_id": job["job_id"], "job_key": job["job_key"]})
        listing = (await other.read_resource("kb://jobs")).contents[0].text  # type: ignore[union-attr]
        texts += [json.dumps(theirs), json.dumps(with_key), listing]

    assert crashed["record"]["verdict"] == "needs_gpu" and mine["status"] == "succeeded"  # never ran here
    assert "the candidate was not judged" in str(problem_error.value)
    assert NAME not in shown["output"] and "leaking" not in crashed["summary"]  # the candidate never ran here
    # the submitter sees its job's output and exception text; another client only the record
    assert mine["result"]["summary"] and mine["result"]["record"]["verdict"] == "needs_gpu"
    assert theirs["result"]["record"] == mine["result"]["record"]
    for public in (theirs, same_session_no_key):  # without the key, nobody sees the private text
        blanked = public["result"]
        assert blanked["summary"] == "" and blanked["output"] == "" and blanked["findings"] == []
    assert with_key["result"]["summary"] == mine["result"]["summary"]
    _assert_nowhere(secret, texts, kb.parent)


def test_redaction_of_names_encodings_and_configured_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kb_mcp.tools import disclosure
    from kb_mcp.tools.disclosure import redact, secret_values

    monkeypatch.setattr(disclosure, "_registered", set())  # tokens other tests' servers registered in this process
    extra = tmp_path / "redact.txt"
    extra.write_text("configured-value-123\n\nshort\n")
    env = {"GITHUB_TOKEN": "ghp_" + "a" * 30, "MY_DB_PASSWORD": "hunter2hunter2", "PLAIN": "not-a-secret-at-all",
           "OTHER": "listed-by-name-99", "KB_MCP_REDACT_ENV": "OTHER", "KB_MCP_REDACT_FILE": str(extra), "X_KEY": "1"}
    table = secret_values(env)
    assert set(table) == {"ghp_" + "a" * 30, "hunter2hunter2", "listed-by-name-99", "configured-value-123"}
    text = "tok ghp_" + "a" * 30 + " pw " + b"hunter2hunter2".hex() + (" other listed-by-name-99 plain "
                                                                       "not-a-secret-at-all")
    out = redact(text, table)
    assert "[redacted $GITHUB_TOKEN]" in out and "[redacted $MY_DB_PASSWORD]" in out and "[redacted $OTHER]" in out
    assert "not-a-secret-at-all" in out and "hunter2" not in out


def test_a_binary_file_is_checked_for_secret_values_in_any_encoding() -> None:
    from kb_mcp.tools.disclosure import secret_in

    table = {"hunter2hunter2": "$MY_DB_PASSWORD"}
    blob = bytes(range(256)) * 4
    assert secret_in(blob, table) is None and secret_in(b"", table) is None
    for form in (b"hunter2hunter2", b"hunter2hunter2".hex().encode(), base64.b64encode(b"xhunter2hunter2")):
        assert secret_in(blob[:300] + form + blob[300:], table) == "$MY_DB_PASSWORD"


def test_public_copy_blanks_every_private_field() -> None:
    from kb_mcp.kb.models import CandidateRecord, Verdict
    from kb_mcp.tools.compile_and_verify import CompileSummary, Correctness, Result
    from kb_mcp.tools.disclosure import public_copy

    record = CandidateRecord(candidate_id="c_1", problem="p", problem_hash="h", verdict=Verdict.crashed)
    full = Result(record=record, summary="crashed: raised KeyError('x')", candidate_path="/c.py", output="stdout",
                  compile=CompileSummary(ok=False, style="nvrtc", seconds=0.1, cached=False, messages=["error: x"]),
                  correctness=Correctness(sets_passed=0, sets_total=1, first_failure="set 0: boom"))
    shown = public_copy(full)
    assert shown.record == record and shown.candidate_path == "/c.py"
    assert (shown.summary, shown.output, shown.compile.messages, shown.correctness.first_failure) == ("", "", [], None)
    assert full.output == "stdout"  # the original is untouched
