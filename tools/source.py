"""The one place that decides whether a tool argument is a file path or source text.

`problem` and `candidate` arguments take either. A value without a line break that names a
source file (by its suffix, or because something exists at that path) is a path, read on the
server's own machine (a folder or a special file there is refused as such); anything else is the
source text itself. What cannot be a Python module is refused here with a message that says what
to send instead: a path the server cannot see (a client on another machine, e.g. over HTTP, should
send the file's text), or CUDA/C++ where a Python module belongs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict

from kb_mcp.harness.problem import Problem, ProblemError, parse_problem
from kb_mcp.kb import pyparse
from kb_mcp.kb.errors import decode_utf8, storage_error
from kb_mcp.tools.base import ToolError

__all__ = ["CUDA_SUFFIXES", "Source", "SourceText", "problem_failed", "read_problem", "read_source"]

Source = Annotated[str, "path or text"]
"""The type of a tool argument that is a path to a `.py` file on the server's machine, or the
source text; `read_source` resolves it."""

Kind = Literal["problem", "candidate"]

CUDA_SUFFIXES = frozenset({".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp"})
_SOURCE_SUFFIXES = CUDA_SUFFIXES | {".py"}
_CUDA_TEXT = re.compile(r"^\s*(#include\s*[<\"]|extern\s+\"C\"|template\s*<)|__global__|__device__", re.M)

_WHAT_IT_IS = {
    "problem": "a KernelBench problem is a Python module (class Model, get_inputs, get_init_inputs)",
    "candidate": (
        "a candidate is a Python module defining class ModelNew that builds its CUDA code from a string "
        "(torch.utils.cpp_extension.load_inline or NVRTC; docs/candidates.md)"
    ),
}


class SourceText(BaseModel):
    """A problem or candidate as the tools use it: its text, and its file when it came from one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    path: str | None = None

    @property
    def name(self) -> str:
        """The file's stem, or '' for text sent inline."""
        return Path(self.path).stem if self.path else ""


def read_source(value: str, what: Kind) -> SourceText:
    """Resolves a `problem` or `candidate` argument; raises ToolError with what to send instead."""
    if _is_path(value):
        return _read_file(Path(value.strip()).expanduser(), what)
    _refuse_cuda_text(value, what)
    return SourceText(text=value)


def read_problem(value: Source) -> Problem:
    """The KernelBench problem a `problem` argument names; raises ToolError when it is not one."""
    source = read_source(value, "problem")
    try:
        return parse_problem(source.text, name=source.name or "problem", path=source.path)
    except ProblemError as exc:
        raise ToolError(str(exc)) from exc


def problem_failed(problem: Problem, error: str, consequence: str) -> ToolError:
    """The error for a problem whose own code failed (import, its inputs, its Model): the caller's to
    fix, and never an outcome of a candidate. Every tool that runs a problem words it here."""
    return ToolError(f"the problem {problem.path or '(given as source text)'} failed before any candidate code "
                     f"ran: {error}. Fix the problem; {consequence}")


def _is_path(value: str) -> bool:
    if "\n" in value or not value.strip():
        return False
    text = value.strip()
    if Path(text).suffix.lower() in _SOURCE_SUFFIXES:
        return True
    try:  # anything there is a path: a folder or a device is refused as such, never parsed as source text
        return Path(text).expanduser().exists()
    except OSError:  # a long one-line source is not a path the OS accepts
        return False


def _read_file(path: Path, what: Kind) -> SourceText:
    if path.suffix.lower() in CUDA_SUFFIXES:
        raise ToolError(
            f"{what} {path} is a CUDA/C++ file, but {_WHAT_IT_IS[what]}. Put the CUDA code in a string "
            f"inside that Python module and pass the module as `{what}`."
        )
    if path.is_dir() or (path.exists() and not path.is_file()):
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise ToolError(f"{what} {path} is {kind}, pass a .py file (or the module's source text) as `{what}`.")
    if not path.is_file():
        raise ToolError(
            f"{what} file not found on the server's machine: {path}. The server reads paths on its own "
            f"file system; a client elsewhere (e.g. over HTTP) should send the file's text as `{what}` instead."
        )
    try:
        data = path.read_bytes()
    except OSError as exc:  # permissions, an I/O error: the machine's, not the caller's
        raise storage_error(exc, f"read the {what} file", path) from exc
    return SourceText(text=decode_utf8(data, path), path=str(path.resolve()))


def _refuse_cuda_text(text: str, what: Kind) -> None:
    """CUDA/C++ sent where a Python module belongs gets named as such, not as a Python syntax error."""
    if not _CUDA_TEXT.search(text):
        return
    try:
        pyparse.parse(text)
    except SyntaxError:
        raise ToolError(
            f"the {what} text is CUDA/C++ source, not Python: {_WHAT_IT_IS[what]}. Put the CUDA code in a "
            f"string inside that Python module and pass the module as `{what}`."
        ) from None
