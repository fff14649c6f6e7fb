"""Which files of its machine an HTTP server reads for its clients: a spawned `kb-mcp serve --http`
and real MCP clients. Without `--files` none (clients send the text); with it, regular files of the
right suffix inside the operator's folders only. A refused path reads the same whether or not it
exists, and a job is held to the same rule as a direct call. A source over the size limit is refused,
as text or as a file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from serverproc import http_server, run_cli

from kb_mcp.clients.mcp_client import ToolCallError, call_json, connect_http
from kb_mcp.tools.source import MAX_SOURCE_BYTES

TOKEN = "s3cret-token-for-tests-0123456789"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROBLEM = (EXAMPLES / "problems" / "swish.py").read_text()
SECRET = 'db_url = "postgres://admin:pw-only-on-the-server@10.0.0.5/prod"\n'
NO_FILES = "this server reads no files of its clients at all: pass the file's text as `candidate` instead"


def _server_files(tmp_path: Path) -> tuple[Path, Path]:
    """A folder the operator allows (a problem and a candidate in it, a link out of it) and a private
    file of the server's account beside it."""
    allowed, private = tmp_path / "allowed", tmp_path / "private"
    allowed.mkdir()
    private.mkdir()
    (allowed / "swish.py").write_text(PROBLEM)
    (allowed / "candidate.py").write_text("class ModelNew: pass  # from the allowed folder\n")
    (private / "secret.py").write_text(SECRET)
    (private / "secret.txt").write_text(SECRET)
    (allowed / "link.py").symlink_to(private / "secret.py")
    return allowed, private


async def _refusal(client, tool: str, arguments: dict[str, object]) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ToolCallError) as err:
        await call_json(client, tool, arguments)
    assert err.value.error is not None and err.value.error["whose"] == "caller", err.value
    return str(err.value)


async def _source_of(client, candidate_id: str) -> str:  # type: ignore[no-untyped-def]
    doc = json.loads((await client.read_resource(f"kb://candidate/{candidate_id}")).contents[0].text)
    return str(doc.get("source") or "")


async def test_an_http_server_without_files_reads_no_file_for_its_clients(kb_path: Path, tmp_path: Path) -> None:
    _, private = _server_files(tmp_path)
    with http_server(kb_path, ["--http", "127.0.0.1:0"], env={"KB_MCP_TOKEN": TOKEN}) as server:
        async with connect_http(server.url, TOKEN) as client:
            there = await _refusal(client, "compile_and_verify",
                                   {"problem": PROBLEM, "candidate": str(private / "secret.txt")})
            missing = await _refusal(client, "compile_and_verify",
                                     {"problem": PROBLEM, "candidate": str(private / "no-such-file")})
            assert NO_FILES in there and "--arg candidate=@FILE" in there
            assert "kb-mcp serve --http --files DIR" in there
            assert missing == there  # nothing tells the client whether the path exists
            problem = await _refusal(client, "compile_and_verify",
                                     {"problem": str(private / "secret.py"), "candidate": "class ModelNew: pass\n"})
            assert "`problem` names a file on the server's machine" in problem
            for tool in ("profile_kernel", "decompose_problem"):
                assert "reads no files of its clients" in await _refusal(client, tool,
                                                                         {"problem": str(private / "secret.py")})
            report = await _refusal(client, "profile_kernel", {"report": [str(private / "secret.txt")]})
            assert "`report` names a file on the server's machine" in report
            # the text itself is what a client sends, and it works as before
            out = await call_json(client, "compile_and_verify",
                                  {"problem": PROBLEM, "candidate": "class ModelNew: pass  # as text\n"})
            assert "# as text" in await _source_of(client, out["record"]["candidate_id"])
    assert "pw-only-on-the-server" not in server.stderr


async def test_an_http_server_reads_only_inside_the_folders_of_files(kb_path: Path, tmp_path: Path) -> None:
    allowed, private = _server_files(tmp_path)
    args = ["--http", "127.0.0.1:0", "--files", str(allowed)]
    with http_server(kb_path, args, env={"KB_MCP_TOKEN": TOKEN}) as server:
        async with connect_http(server.url, TOKEN) as client:
            inside = await call_json(client, "compile_and_verify", {"problem": str(allowed / "swish.py"),
                                                                    "candidate": str(allowed / "candidate.py")})
            assert inside["record"]["problem"] == "swish"
            assert "# from the allowed folder" in await _source_of(client, inside["record"]["candidate_id"])
            outside = f"this server reads no files of its clients outside {allowed.resolve()}"
            refused = [await _refusal(client, "compile_and_verify", {"problem": PROBLEM, "candidate": value})
                       for value in (str(private / "secret.py"), str(private / "no-such.py"),
                                     str(allowed / "link.py"),  # a link inside that points outside
                                     str(allowed / ".." / "private" / "secret.py"),
                                     str(allowed / "no-such.py"))]
            assert all(outside in message for message in refused), refused
            assert len(set(refused)) == 1  # the same words for a file that exists and one that does not
            report = await _refusal(client, "profile_kernel", {"report": [str(private / "secret.txt")]})
            assert outside in report
    assert "pw-only-on-the-server" not in server.stderr


async def test_a_job_is_held_to_the_servers_file_access(kb_path: Path, tmp_path: Path) -> None:
    _, private = _server_files(tmp_path)
    with http_server(kb_path, ["--http", "127.0.0.1:0"], env={"KB_MCP_TOKEN": TOKEN}) as server:
        async with connect_http(server.url, TOKEN) as client:
            job = await call_json(client, "start_job", {"kind": "compile_and_verify", "arguments": {
                "problem": PROBLEM, "candidate": str(private / "secret.py")}})
            done = await call_json(client, "job_status",
                                   {"job_id": job["job_id"], "job_key": job["job_key"], "wait_s": 60})
    assert done["status"] == "failed", done
    assert NO_FILES in done["error"] and done["error_info"]["whose"] == "caller"
    assert "pw-only-on-the-server" not in json.dumps(done)


async def test_the_folders_can_come_from_the_environment(kb_path: Path, tmp_path: Path) -> None:
    allowed, private = _server_files(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"KB_MCP_TOKEN": TOKEN, "KB_MCP_FILES": os.pathsep.join([str(elsewhere), str(allowed)])}
    with http_server(kb_path, ["--http", "127.0.0.1:0"], env=env) as server:
        async with connect_http(server.url, TOKEN) as client:
            inside = await call_json(client, "compile_and_verify",
                                     {"problem": str(allowed / "swish.py"), "candidate": str(allowed / "candidate.py")})
            assert "# from the allowed folder" in await _source_of(client, inside["record"]["candidate_id"])
            refused = await _refusal(client, "compile_and_verify",
                                     {"problem": PROBLEM, "candidate": str(private / "secret.py")})
            assert f"outside {elsewhere.resolve()}, {allowed.resolve()}" in refused


def test_a_files_folder_that_is_not_one_or_files_without_http_stops_serve(kb_path: Path, tmp_path: Path) -> None:
    missing = run_cli(["--kb", str(kb_path), "serve", "--http", "127.0.0.1:0", "--files", str(tmp_path / "nope")])
    assert missing.returncode == 2 and "is not a folder on this machine" in missing.stderr
    assert "Traceback" not in missing.stderr
    from_env = run_cli(["--kb", str(kb_path), "serve", "--http", "127.0.0.1:0"],
                       env={"KB_MCP_FILES": str(tmp_path / "nope")})
    assert from_env.returncode == 2 and "KB_MCP_FILES" in from_env.stderr and "is not a folder" in from_env.stderr
    stdio = run_cli(["--kb", str(kb_path), "serve", "--files", str(tmp_path)], stdin="")
    assert stdio.returncode == 2 and "--files applies to --http only" in stdio.stderr


async def test_a_source_over_the_limit_is_refused_as_text_and_as_a_file(kb_path: Path, tmp_path: Path) -> None:
    allowed, _ = _server_files(tmp_path)
    line = "# " + "x" * 97 + "\n"
    over = PROBLEM + line * (MAX_SOURCE_BYTES // len(line))  # a little over 1 MiB
    (allowed / "over.py").write_text(over)
    size = len(over.encode())
    args = ["--http", "127.0.0.1:0", "--files", str(allowed)]
    with http_server(kb_path, args, env={"KB_MCP_TOKEN": TOKEN}) as server:
        async with connect_http(server.url, TOKEN) as client:
            for value, named in [(over, "the candidate text"),
                                 (str(allowed / "over.py"), f"candidate {allowed.resolve() / 'over.py'}")]:
                refused = await _refusal(client, "compile_and_verify", {"problem": PROBLEM, "candidate": value})
                assert f"{named} is 1.0 MiB ({size} bytes), over the 1.0 MiB (1048576 bytes)" in refused, refused
            for tool in ("profile_kernel", "decompose_problem"):
                refused = await _refusal(client, tool, {"problem": str(allowed / "over.py")})
                assert f"problem {allowed.resolve() / 'over.py'} is 1.0 MiB ({size} bytes)" in refused, refused
    # nothing of it was saved where candidates are kept
    assert not [p for p in (kb_path.parent / "candidates").rglob("*") if p.stat().st_size > MAX_SOURCE_BYTES]
