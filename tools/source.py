"""The one place that decides whether a tool argument is a file path or source text, and which files
of the server's machine a tool may read for its caller.

`problem` and `candidate` arguments take either. A value without a line break that names a
source file (by its suffix, or because something exists at that path) is a path, read on the
server's own machine (a folder or a special file there is refused as such); anything else is the
source text itself. What cannot be a Python module is refused here with a message that says what
to send instead: a path the server cannot see (a client on another machine, e.g. over HTTP, should
send the file's text), or CUDA/C++ where a Python module belongs.

Which files may be read is the context's `FileAccess` (`ToolContext.files`): None where the caller
is the server's own user on its own machine (stdio, `kb-mcp call` without --url, the operator's CLI
commands), which reads any file that user can; for an HTTP server, whose clients are others, only
the folders its operator names (`kb-mcp serve --http --files DIR`), none by default.
`readable_file` applies it to every argument that names a file (a campaign's problems too).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict

from kb_mcp.harness.problem import MAX_SOURCE_BYTES, Problem, ProblemError, parse_problem
from kb_mcp.kb import pyparse
from kb_mcp.kb.errors import ToolError, decode_utf8, storage_error

__all__ = ["CUDA_SUFFIXES", "MAX_SOURCE_BYTES", "FileAccess", "Source", "SourceText", "problem_failed", "read_problem",
           "read_source", "readable_file"]

Source = Annotated[str, "path or text"]
"""The type of a tool argument that is a path to a `.py` file on the server's machine, or the
source text; `read_source` resolves it."""

Kind = Literal["problem", "candidate"]
FileKind = Literal["problem", "candidate", "report"]
"""What an argument that names a file names: a problem or candidate module, or a profiler report."""

CUDA_SUFFIXES = frozenset({".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp"})
_SOURCE_SUFFIXES = CUDA_SUFFIXES | {".py"}
_READABLE_SUFFIXES: dict[str, frozenset[str]] = {
    "problem": frozenset({".py"}), "candidate": frozenset({".py"}), "report": frozenset({".ncu-rep", ".csv"}),
}
"""The suffixes a restricted server reads for each kind of argument: what the tool can use, nothing else."""
_PATH_START = ("/", "~", "./", "../")  # no Python module starts so: a value that does is a path
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


class FileAccess(BaseModel):
    """The files of the server's machine a tool reads for its caller, where that caller is not the
    server's own user (an HTTP server's clients): regular files inside `folders` only, none at all
    when there are none. A context whose caller is the server's own user holds None instead."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    folders: tuple[Path, ...] = ()
    """Resolved (links followed), so that a file's resolved path can be compared with them."""

    @classmethod
    def of(cls, folders: Iterable[str | Path]) -> FileAccess:
        """The policy over the operator's folders; ValueError names one that is not a folder here."""
        resolved: list[Path] = []
        for folder in folders:
            path = Path(folder).expanduser().resolve()
            if not path.is_dir():
                raise ValueError(f"{folder} is not a folder on this machine: name folders whose files the "
                                 "server may read for its clients")
            resolved.append(path)
        return cls(folders=tuple(dict.fromkeys(resolved)))

    def holds(self, path: Path) -> bool:
        """Whether a resolved path lies inside one of the folders."""
        return any(path.is_relative_to(folder) for folder in self.folders)

    def describe(self) -> str:
        """The folders as the refusal names them."""
        if not self.folders:
            return "at all"
        return "outside " + ", ".join(str(f) for f in self.folders)


def readable_file(files: FileAccess | None, value: str, what: FileKind) -> Path:
    """The file a tool argument names (`value`, a path), as the server may read it for its caller.

    With `files` None (the caller is the server's own user) that is the path as given, checked by
    whoever reads it. Under a `FileAccess` it must resolve (links followed, `..` normalised) to a
    regular file with the suffix of `what` inside the policy's folders; anything else raises the same
    ToolError, whether or not the path exists: the refusal tells a client nothing about the server's
    files. A campaign's problems go through here as `problem`."""
    path = _as_path(value)
    if files is None:
        return path
    try:
        real = path.resolve()
        allowed = files.holds(real) and real.suffix.lower() in _READABLE_SUFFIXES[what] and real.is_file()
    except (OSError, RuntimeError):  # a loop of links, a name the OS refuses: not readable either way
        allowed = False
    if not allowed:
        raise _not_readable(files, what)
    return real


def readable_problems(files: FileAccess | None, values: Iterable[str], found: Iterable[Path]) -> None:
    """Raises the refusal of `readable_file` unless every path a campaign was given (`values`: problem
    files or folders) and every problem file found through them (`found`) lies inside the policy's
    folders: a folder is read for its problems, and a link in it must not lead outside either. Each
    problem found is at most `MAX_SOURCE_BYTES`, as `read_source` holds a problem file."""
    if files is None:
        return
    for value in values:
        try:
            real = _as_path(value).resolve()
            allowed = files.holds(real) and real.is_dir()
        except (OSError, RuntimeError):
            allowed = False
        if not allowed:
            readable_file(files, value, "problem")
    for path in found:
        real = readable_file(files, str(path), "problem")
        try:
            size = real.stat().st_size
        except OSError as exc:
            raise storage_error(exc, "read the problem file", real) from exc
        _refuse_too_large(size, "problem", f"problem {path}")


def _not_readable(files: FileAccess, what: FileKind) -> ToolError:
    instead = (f"pass the file's text as `{what}` instead (with `kb-mcp call`, `--arg {what}=@FILE` sends a local "
               "file's text)") if what != "report" else \
        "profile with `problem` instead, or have the report copied into a folder the server reads"
    return ToolError(f"`{what}` names a file on the server's machine, and this server reads no files of its clients "
                     f"{files.describe()}: {instead}. The server's operator can allow folders with "
                     "`kb-mcp serve --http --files DIR`.")


def read_source(value: str, what: Kind, files: FileAccess | None) -> SourceText:
    """Resolves a `problem` or `candidate` argument, reading a path only as `files` allows (see
    `readable_file`); raises ToolError with what to send instead."""
    # first: no path is this long, and a value this long is refused as it is, whatever its shape
    _refuse_too_large(_utf8_size(value), what, f"the {what} text")
    if not _is_path(value, files):
        _refuse_cuda_text(value, what)
        return SourceText(text=value)
    _refuse_cuda_file(_as_path(value), what)
    return _read_file(readable_file(files, value, what), what)


def read_problem(value: Source, files: FileAccess | None) -> Problem:
    """The KernelBench problem a `problem` argument names (a path read only as `files` allows);
    raises ToolError when it is not one."""
    source = read_source(value, "problem", files)
    try:
        return parse_problem(source.text, name=source.name or "problem", path=source.path)
    except ProblemError as exc:
        raise ToolError(str(exc)) from exc


def problem_failed(problem: Problem, error: str, consequence: str) -> ToolError:
    """The error for a problem whose own code failed (import, its inputs, its Model): the caller's to
    fix, and never an outcome of a candidate. Every tool that runs a problem words it here."""
    return ToolError(f"the problem {problem.path or '(given as source text)'} failed before any candidate code "
                     f"ran: {error}. Fix the problem; {consequence}")


def _is_path(value: str, files: FileAccess | None) -> bool:
    if "\n" in value or not value.strip():
        return False
    text = value.strip()
    if Path(text).suffix.lower() in _SOURCE_SUFFIXES:
        return True
    if files is not None:  # by its shape alone: whether something exists there is not the client's to learn
        return text.startswith(_PATH_START)
    try:  # anything there is a path: a folder or a device is refused as such, never parsed as source text
        return _as_path(text).exists()
    except OSError:  # a long one-line source is not a path the OS accepts
        return False


def _as_path(value: str) -> Path:
    """The path a value names, `~` expanded; `~name` of no user here stays as given (found nowhere),
    so that it is refused as any missing path is, not told apart."""
    path = Path(value.strip())
    try:
        return path.expanduser()
    except RuntimeError:
        return path


def _refuse_cuda_file(path: Path, what: Kind) -> None:
    """A CUDA/C++ file named where a Python module belongs gets named as such (by its name alone)."""
    if path.suffix.lower() in CUDA_SUFFIXES:
        raise ToolError(
            f"{what} {path} is a CUDA/C++ file, but {_WHAT_IT_IS[what]}. Put the CUDA code in a string "
            f"inside that Python module and pass the module as `{what}`."
        )


def _read_file(path: Path, what: Kind) -> SourceText:
    if path.is_dir() or (path.exists() and not path.is_file()):
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise ToolError(f"{what} {path} is {kind}, pass a .py file (or the module's source text) as `{what}`.")
    if not path.is_file():
        raise ToolError(
            f"{what} file not found on the server's machine: {path}. The server reads paths on its own "
            f"file system; a client elsewhere (e.g. over HTTP) should send the file's text as `{what}` instead."
        )
    try:
        with path.open("rb") as file:
            _refuse_too_large(os.fstat(file.fileno()).st_size, what, f"{what} {path}")
            data = file.read(MAX_SOURCE_BYTES + 1)  # a file that grew since is not read past the limit either
    except OSError as exc:  # permissions, an I/O error: the machine's, not the caller's
        raise storage_error(exc, f"read the {what} file", path) from exc
    _refuse_too_large(len(data), what, f"{what} {path}")
    return SourceText(text=decode_utf8(data, path), path=str(path.resolve()))


def _utf8_size(text: str) -> int:
    """The size of `text` in UTF-8 bytes (a lone surrogate, which JSON can carry, counts as 3)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _refuse_too_large(size: int, what: Kind, named: str) -> None:
    """A source over `MAX_SOURCE_BYTES` is the caller's error, with both sizes in it."""
    if size > MAX_SOURCE_BYTES:
        raise ToolError(
            f"{named} is {_size_words(size)}, over the {_size_words(MAX_SOURCE_BYTES)} a {what} may be: "
            f"real ones are a few KB to a few tens of KB. Check that this is the {what} you meant; "
            "keep data (weights, tables) out of the source, and generate it in code instead."
        )


def _size_words(size: int) -> str:
    """`size` bytes as people read it, the exact count beside it."""
    return f"{size / (1 << 20):.1f} MiB ({size} bytes)" if size >= 1 << 20 else f"{size} bytes"


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
