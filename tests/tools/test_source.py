"""`problem` and `candidate` arguments: the one decision between a path and source text, and the
messages that say what to send instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client

from kb_mcp.server.app import build_server
from kb_mcp.tools import compile_and_verify
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext
from kb_mcp.tools.source import (
    MAX_SOURCE_BYTES,
    FileAccess,
    read_problem,
    read_source,
    readable_file,
    readable_problems,
)

ROOT = Path(__file__).resolve().parents[2]
SWISH = ROOT / "examples" / "problems" / "swish.py"
CUDA = """#include <cuda_runtime.h>
__global__ void swish(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / (1.0f + expf(-x[i]));
}
"""


def test_a_path_is_read_and_text_is_taken_as_is(tmp_path: Path) -> None:
    got = read_source(str(SWISH), "problem", None)
    assert got.path == str(SWISH.resolve()) and got.text == SWISH.read_text() and got.name == "swish"
    text = SWISH.read_text()
    assert read_source(text, "problem", None).path is None and read_source(text, "problem", None).text == text
    # an existing file without the .py suffix is still a path
    plain = tmp_path / "problem_source"
    plain.write_text(text)
    assert read_source(str(plain), "problem", None).path == str(plain.resolve())
    problem = read_problem(str(SWISH), None)
    assert problem.name == "swish" and problem.path == str(SWISH.resolve())


def _padded(size: int) -> str:
    """The swish problem, padded with comment lines to exactly `size` UTF-8 bytes."""
    text = SWISH.read_text()
    pad = size - len(text.encode())
    line = "# " + "x" * 97 + "\n"  # 100 bytes
    text += line * (pad // len(line)) + "#" * (pad % len(line))
    assert len(text.encode()) == size
    return text


def test_a_source_up_to_the_limit_is_read_as_text_and_as_a_file(tmp_path: Path) -> None:
    text = _padded(MAX_SOURCE_BYTES)
    path = tmp_path / "at_limit.py"
    path.write_text(text)
    assert read_source(text, "candidate", None).text == text
    assert read_source(str(path), "candidate", None).text == text
    assert read_problem(str(path), None).name == "at_limit"


def test_a_source_over_the_limit_is_the_callers_error_with_both_sizes(tmp_path: Path) -> None:
    text = _padded(MAX_SOURCE_BYTES + 1)
    path = tmp_path / "over_limit.py"
    path.write_text(text)
    allowed = FileAccess.of([tmp_path])
    for value, named in [(text, "the candidate text"), (str(path), f"candidate {path}")]:
        for files in (None, allowed):
            with pytest.raises(ToolError) as err:
                read_source(value, "candidate", files)
            assert err.value.whose == "caller"
            assert f"{named} is 1.0 MiB (1048577 bytes), over the 1.0 MiB (1048576 bytes) a candidate may be" \
                in str(err.value)
    with pytest.raises(ToolError, match="problem text is 1.0 MiB"):
        read_problem(text, None)


def test_a_huge_file_is_refused_by_its_size_before_it_is_read(tmp_path: Path) -> None:
    huge = tmp_path / "huge.py"
    with huge.open("wb") as f:  # sparse: 64 GiB that nothing here could hold in memory
        f.truncate(64 << 30)
    with pytest.raises(ToolError, match=r"problem .*huge.py is 65536.0 MiB \(68719476736 bytes\), over the"):
        read_problem(str(huge), FileAccess.of([tmp_path]))


def test_a_campaigns_problem_files_are_held_to_the_same_limit(tmp_path: Path) -> None:
    small, large = tmp_path / "small.py", tmp_path / "large.py"
    small.write_text(SWISH.read_text())
    large.write_text(_padded(MAX_SOURCE_BYTES + 1))
    allowed = FileAccess.of([tmp_path])
    readable_problems(allowed, [str(tmp_path)], [small])
    with pytest.raises(ToolError, match=f"problem {large} is 1.0 MiB \\(1048577 bytes\\), over the"):
        readable_problems(allowed, [str(tmp_path)], [small, large])


def test_a_missing_path_says_the_server_reads_its_own_files() -> None:
    with pytest.raises(ToolError) as err:
        read_source("/home/someone/work/relu_new.py", "candidate", None)
    message = str(err.value)
    assert "candidate file not found on the server's machine: /home/someone/work/relu_new.py" in message
    assert "send the file's text as `candidate` instead" in message


def test_a_folder_or_a_special_file_is_refused_as_such_not_parsed_as_source_text(tmp_path: Path) -> None:
    named_py = tmp_path / "looks_like.py"
    named_py.mkdir()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # read as a file, it would block until a writer came
    for value, kind in [(tmp_path, "a directory"), (named_py, "a directory"), (fifo, "not a regular file"),
                        (Path("/dev/null"), "not a regular file")]:
        for what in ("problem", "candidate"):
            with pytest.raises(ToolError, match=f"is {kind}, pass a .py file") as err:
                read_source(str(value), what, None)  # type: ignore[arg-type]
            assert err.value.whose == "caller" and "syntax error" not in str(err.value)


def test_compile_and_verify_given_a_folder_says_so(tmp_path: Path) -> None:
    ctx = ToolContext(tmp_path / "kb.json")
    try:
        with pytest.raises(ToolError, match=rf"problem {tmp_path} is a directory, pass a .py file"):
            compile_and_verify.run(ctx, compile_and_verify.Request(problem=str(tmp_path), candidate=str(SWISH)))
    finally:
        ctx.close()
    proc = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp_path / "kb.json"), "call",
                           "compile_and_verify", "--arg", f"problem={tmp_path}", "--arg", f"candidate={SWISH}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"problem {tmp_path} is a directory, pass a .py file" in proc.stderr
    assert "syntax error" not in proc.stderr


def test_a_cuda_file_or_cuda_text_is_named_as_such(tmp_path: Path) -> None:
    kernel = tmp_path / "swish.cu"
    kernel.write_text(CUDA)
    with pytest.raises(ToolError, match=r"swish\.cu is a CUDA/C\+\+ file, but a candidate is a Python module"):
        read_source(str(kernel), "candidate", None)
    with pytest.raises(ToolError, match=r"the candidate text is CUDA/C\+\+ source, not Python"):
        read_source(CUDA, "candidate", None)
    with pytest.raises(ToolError, match="a KernelBench problem is a Python module"):
        read_source(str(kernel), "problem", None)


def test_python_that_mentions_cuda_keywords_is_left_to_the_harness() -> None:
    module = 'KERNEL = r"""\n__global__ void k() {}\n"""\nclass ModelNew: pass\n'
    assert read_source(module, "candidate", None).text == module


async def test_compile_and_verify_refuses_a_cu_file_before_any_work(tmp_path: Path) -> None:
    kernel = tmp_path / "swish.cu"
    kernel.write_text(CUDA)
    ctx = ToolContext(tmp_path / "kb.json")
    server = build_server(ctx)
    try:
        async with Client(server) as client:
            result = await client.call_tool("compile_and_verify", {"problem": str(SWISH), "candidate": str(kernel)})
        started_a_worker = "workers" in ctx.__dict__
    finally:
        server.jobs.shutdown(wait=True)
        ctx.close()
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert "is a CUDA/C++ file, but a candidate is a Python module defining class ModelNew" in text
    assert "syntax error" not in text.lower()
    assert not started_a_worker  # refused before any worker started


def _allowed_and_private(tmp_path: Path) -> tuple[FileAccess, Path, Path]:
    allowed, private = tmp_path / "allowed", tmp_path / "private"
    allowed.mkdir()
    private.mkdir()
    (allowed / "swish.py").write_text(SWISH.read_text())
    (allowed / "raw.csv").write_text("ID,Kernel Name\n")
    (private / "secret.py").write_text("TOKEN = 'only-on-the-server'\n")
    (allowed / "link.py").symlink_to(private / "secret.py")
    (allowed / "sub.py").mkdir()
    return FileAccess.of([allowed]), allowed, private


def test_a_restricted_policy_reads_regular_files_of_the_right_suffix_inside_its_folders(tmp_path: Path) -> None:
    files, allowed, _ = _allowed_and_private(tmp_path)
    assert read_source(str(allowed / "swish.py"), "problem", files).text == SWISH.read_text()
    assert readable_file(files, str(allowed / "raw.csv"), "report") == (allowed / "raw.csv").resolve()
    assert read_source(SWISH.read_text(), "problem", files).path is None  # text is text under any policy


def test_a_restricted_policy_refuses_every_other_path_in_the_same_words(tmp_path: Path) -> None:
    files, allowed, private = _allowed_and_private(tmp_path)
    refused = [str(private / "secret.py"), str(private / "missing.py"), str(allowed / "link.py"),
               str(allowed / ".." / "private" / "secret.py"), str(allowed / "missing.py"), str(allowed / "sub.py"),
               str(allowed / "raw.csv"), "/etc/hostname", "/no/such/file", "~/.ssh/id_ed25519",
               "~root/x.py", "~no-such-user-here/x.py"]
    messages = set()
    for value in refused:
        with pytest.raises(ToolError) as err:
            read_source(value, "candidate", files)
        assert err.value.whose == "caller"
        messages.add(str(err.value))
    (message,) = messages  # whether a path exists on the server is not told
    assert f"this server reads no files of its clients outside {files.folders[0]}" in message
    assert "--arg candidate=@FILE" in message and "kb-mcp serve --http --files DIR" in message
    with pytest.raises(ToolError, match="reads no files of its clients at all: pass"):
        read_source(str(allowed / "swish.py"), "problem", FileAccess())
    with pytest.raises(ToolError, match="`report` names a file"):
        readable_file(files, str(allowed / "swish.py"), "report")


def test_without_a_policy_the_path_is_read_as_given(tmp_path: Path) -> None:
    _, _, private = _allowed_and_private(tmp_path)
    assert "only-on-the-server" in read_source(str(private / "secret.py"), "candidate", None).text
    assert readable_file(None, "~/x.csv", "report") == Path("~/x.csv").expanduser()


def test_a_policy_is_made_of_existing_folders_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a folder on this machine"):
        FileAccess.of([tmp_path / "nope"])
