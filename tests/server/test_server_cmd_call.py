"""`kb-mcp call`: any tool from a shell, in-process or against a running HTTP server; JSON on stdout,
errors on stderr with a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serverproc import http_server, run_cli

from kb_mcp.kb.errors import CallerError
from kb_mcp.server.cli import main
from kb_mcp.server.cmd_call import UsageError, build_arguments, parse_value

STATE = "memory_bandwidth_saturated"
EXAMPLES = Path(__file__).parents[2] / "examples"


def test_argument_values(tmp_path: Path) -> None:
    source = tmp_path / "cand.py"
    source.write_text("class ModelNew: ...\n")
    assert parse_value("3") == 3 and parse_value("0.5") == 0.5 and parse_value("true") is True
    assert parse_value('["a", "b"]') == ["a", "b"]
    assert parse_value("memory_bandwidth_saturated") == "memory_bandwidth_saturated"
    assert parse_value(f"@{source}") == "class ModelNew: ...\n"
    args = build_arguments('{"k": 1, "state_id": "x"}', ["k=4", "exclude=[\"a\"]", f"candidate=@{source}"])
    assert args == {"k": 4, "state_id": "x", "exclude": ["a"], "candidate": "class ModelNew: ...\n"}
    for bad_json, bad_pairs, message in [
        ("[1]", [], "JSON object"),
        ("{", [], "not valid JSON"),
        (None, ["novalue"], "KEY=VALUE"),
    ]:
        with pytest.raises(UsageError, match=message):
            build_arguments(bad_json, bad_pairs)
    with pytest.raises(CallerError, match="cannot read the file"):  # the file's path is the caller's to fix
        build_arguments(None, [f"x=@{tmp_path / 'missing.py'}"])


def test_list_and_call_in_process(kb_path: Path) -> None:
    kb = ["--kb", str(kb_path)]
    listed = run_cli([*kb, "call", "--list"])
    assert listed.returncode == 0, listed.stderr
    assert "suggest_optimizations(state_id*, k=3" in listed.stdout and "job_status(job_id*" in listed.stdout

    called = run_cli([*kb, "call", "suggest_optimizations", "--arg", f"state_id={STATE}", "--arg", "k=2",
                      "--arg", "temperature=0"])
    assert called.returncode == 0, called.stderr
    result = json.loads(called.stdout)
    assert result["state_id"] == STATE and 1 <= len(result["suggestions"]) <= 2


async def test_list_reads_declarations_the_server_serves_unchanged(
    kb_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `call --list` skips building a server; what it prints must be what the server lists over MCP
    from mcp import Client

    from kb_mcp.server.app import build_server
    from kb_mcp.server.cmd_call import describe_tool
    from kb_mcp.tools.context import ToolContext

    server = build_server(ToolContext(kb_path))
    try:
        async with Client(server) as client:
            served = [describe_tool(t.name, t.description, t.input_schema) for t in (await client.list_tools()).tools]
    finally:
        server.jobs.shutdown()
        server.kb_ctx.close()
    assert main(["--kb", str(kb_path), "call", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[:-1] == "\n".join(served).splitlines() and len(served) == len(server.specs) == 9
    assert not kb_path.exists()  # a listing opens no KB


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["suggest_optimizations", "--json", '{"state_id": "no_such_state"}'], 1,
         "kb-mcp call suggest_optimizations: unknown state_id 'no_such_state'"),
        (["suggest_optimizations", "--arg", "k=ten"], 1, "- state_id: required"),
        (["make_it_fast"], 2, "no tool 'make_it_fast'; tools: "),
        ([], 2, "name a tool"),
        (["suggest_optimizations", "--arg", "k"], 2, "--arg wants KEY=VALUE"),
    ],
)
def test_call_errors_go_to_stderr_with_an_exit_status(
    kb_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    # the console entry point's own function, run in this process (same code path as the command)
    assert main(["--kb", str(kb_path), "call", *argv]) == code
    out, err = capsys.readouterr()
    assert out == "" and message in err


def test_a_job_started_from_the_shell_is_read_back_by_another_command(kb_path: Path) -> None:
    kb = ["--kb", str(kb_path)]
    spec = {"kind": "suggest_optimizations", "arguments": {"state_id": STATE, "k": 1}}
    started = run_cli([*kb, "call", "start_job", "--json", json.dumps(spec)])
    assert started.returncode == 0, started.stderr
    job_id = json.loads(started.stdout)["job_id"]
    status = run_cli([*kb, "call", "job_status", "--arg", f"job_id={job_id}", "--arg", "wait_s=10"])
    assert status.returncode == 0, status.stderr
    got = json.loads(status.stdout)
    assert got["status"] == "succeeded" and got["result"]["state_id"] == STATE


def test_call_a_running_http_server(kb_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = "call-token-0123456789abcdef"
    with http_server(kb_path, ["--http", "127.0.0.1:0"], env={"KB_MCP_TOKEN": token}) as server:
        ok = run_cli(["call", "--url", server.url, "suggest_optimizations", "--arg", f"state_id={STATE}"],
                     env={"KB_MCP_TOKEN": token})
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["state_id"] == STATE
        refused = run_cli(["call", "--url", server.url, "--list"], env={"KB_MCP_TOKEN": ""})
        assert refused.returncode == 2 and "wants a bearer token (401)" in refused.stderr
        wrong = tmp_path / "wrong-token"
        wrong.write_text("x" * 20 + "\n")
        assert main(["call", "--url", server.url, "--token-file", str(wrong), "--list"]) == 2
        assert "refused the bearer token" in capsys.readouterr().err
        right = tmp_path / "token"
        right.write_text(token + "\n")
        ok = run_cli(["call", "--url", server.url, "--token-file", str(right), "--list"], env={"KB_MCP_TOKEN": ""})
        assert ok.returncode == 0, ok.stderr
        assert main(["call", "--url", server.url, "--token", token, "--list"]) == 2  # never on the command line
        assert "--token is not accepted" in capsys.readouterr().err
    assert main(["call", "--url", server.url, "--list"]) == 2
    assert "nothing answers at" in capsys.readouterr().err


def test_a_call_that_runs_past_its_timeout_says_so_in_one_line(kb_path: Path) -> None:
    # a verification takes seconds (a harness process starts); half a second is too little for it
    called = run_cli(["--kb", str(kb_path), "call", "compile_and_verify",
                      "--arg", f"problem={EXAMPLES / 'problems' / 'swish.py'}",
                      "--arg", f"candidate=@{EXAMPLES / 'candidates' / 'swish_nvrtc.py'}", "--timeout", "0.5"])
    assert called.returncode == 1 and called.stdout == ""
    assert "Traceback" not in called.stderr and "Error" not in called.stderr
    last = called.stderr.strip().splitlines()[-1]
    assert last.startswith("kb-mcp call: compile_and_verify did not answer within --timeout 0.5 s: the call was "
                           "given too little time"), called.stderr
    assert "larger --timeout" in last and "`start_job`" in last


def test_a_problem_file_that_is_not_utf8_is_the_environments_with_one_fix(kb_path: Path, tmp_path: Path) -> None:
    problem = tmp_path / "latin1_problem.py"
    problem.write_bytes("# caf\xe9\nimport torch\n".encode("latin-1"))
    called = run_cli(["--kb", str(kb_path), "call", "compile_and_verify", "--arg", f"problem={problem}",
                      "--arg", "candidate=x = 1"])
    assert called.returncode == 3 and called.stdout == ""
    assert f"{problem} is not UTF-8 text (byte 0xe9 at offset 5)" in called.stderr
    assert f"The operator can fix it: save {problem} as UTF-8" in called.stderr
    assert "pass its text" not in called.stderr and "Traceback" not in called.stderr


@pytest.mark.parametrize("form", ["--arg", "--json"])
def test_an_argument_file_that_is_not_utf8_is_named_with_its_byte(kb_path: Path, tmp_path: Path, form: str) -> None:
    given = tmp_path / "latin1.txt"
    given.write_bytes("x = 'caf\xe9'\n".encode("latin-1"))
    how = ["--arg", f"candidate=@{given}"] if form == "--arg" else ["--json", f"@{given}"]
    called = run_cli(["--kb", str(kb_path), "call", "compile_and_verify", *how])
    assert called.returncode == 3 and called.stdout == "" and "Traceback" not in called.stderr, called.stderr
    assert f"{given} is not UTF-8 text (byte 0xe9 at offset 8)" in called.stderr and "iconv" in called.stderr


# Settings of the server's operator: no argument of the call can fix them, so they are the environment's.
OPERATOR_SETTINGS = {
    "KB_MCP_SANDBOX": ("KB_MCP_SANDBOX='abc' is not a sandbox setting", "`kb-mcp doctor`"),
    "KB_MCP_MAX_TIMEOUT_S": ("$KB_MCP_MAX_TIMEOUT_S='abc' is not a number of seconds, more than 0",
                             "unset it for the default (600)"),
}


@pytest.mark.parametrize("variable", sorted(OPERATOR_SETTINGS))
def test_an_operators_setting_the_server_cannot_use_is_the_environments(kb_path: Path, variable: str) -> None:
    called = run_cli(["--kb", str(kb_path), "call", "compile_and_verify",
                      "--arg", f"problem={EXAMPLES / 'problems' / 'swish.py'}",
                      "--arg", f"candidate=@{EXAMPLES / 'candidates' / 'swish_nvrtc.py'}"],
                     env={variable: "abc"})
    what, action = OPERATOR_SETTINGS[variable]
    assert called.returncode == 3 and called.stdout == ""
    assert "not in your arguments" in called.stderr and what in called.stderr
    assert action in called.stderr and "Traceback" not in called.stderr
