"""KernelBench-format problems: `class Model(nn.Module)`, `get_inputs()`, `get_init_inputs()`.

Loading here is static (parse, never execute): the server validates a problem without importing
torch or running user code; execution happens only in sandboxed worker processes, which report a
problem that fails there as such (`VerifyResult.problem_error`).
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kb_mcp.kb import pyparse
from kb_mcp.kb.errors import InputEncodingError, decode_utf8

REQUIRED = ("Model", "get_inputs", "get_init_inputs")

MAX_SOURCE_BYTES = 1 << 20
"""The largest problem or candidate kb-mcp reads, in UTF-8 bytes, as text or as a file: 1 MiB. Real
ones are far smaller (KernelBench problems a few KB, the largest candidates in
bench/kernelbench_solutions about 73 KB), so only a mistake or an attack comes near it; a larger file
is refused before it is read whole (a campaign's or an eval's problem files too, on every transport)."""


class ProblemError(ValueError):
    """A problem file or source that is not in the KernelBench format; the message says what is missing."""


class Problem(BaseModel):
    """A reference PyTorch module with its input generators."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str
    path: str | None = None
    hash: str  # content hash of the source

    @property
    def key(self) -> str:
        """Stable short key for caches: name plus content hash."""
        return f"{self.name}-{self.hash}"


def content_hash(*parts: str) -> str:
    """16 hex digits of SHA-256 over the parts (separated, so ('ab','c') != ('a','bc'))."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def candidate_id(problem: Problem, candidate_source: str) -> str:
    """The content hash that names a candidate for a problem (same code, same problem, same id)."""
    return "c_" + content_hash(problem.hash, candidate_source)


def _missing_names(tree: ast.Module) -> list[str]:
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):  # e.g. `get_inputs = make_inputs`
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return [name for name in REQUIRED if name not in defined]


def parse_problem(source: str, name: str = "problem", path: str | None = None) -> Problem:
    """Validates `source` statically and returns the Problem; raises ProblemError if malformed."""
    where = path or f"<{name}>"
    if not source.strip():
        raise ProblemError(f"{where}: the problem source is empty")
    try:
        tree = pyparse.parse(source, where)
    except SyntaxError as exc:
        raise ProblemError(f"{where}: syntax error at line {exc.lineno}: {exc.msg}") from exc
    missing = _missing_names(tree)
    if missing:
        raise ProblemError(
            f"{where}: not a KernelBench problem, missing top-level {', '.join(missing)} "
            "(needs `class Model(nn.Module)`, `def get_inputs()` and `def get_init_inputs()`)"
        )
    return Problem(name=name, source=source, path=path, hash=content_hash(source))


def load_problem(path: str | Path, name: str | None = None) -> Problem:
    """Loads a problem from its `.py` file, read only up to `MAX_SOURCE_BYTES` (a larger one is a
    ProblemError). (Whether a tool argument is a path or source text is decided in one place,
    `kb_mcp.tools.source`; text goes to `parse_problem`.)"""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ProblemError(f"problem file not found: {path}")
    with path.open("rb") as file:
        data = file.read(MAX_SOURCE_BYTES + 1)  # never more: a 10 GB "problem" must not be held in memory
    if len(data) > MAX_SOURCE_BYTES:
        raise ProblemError(f"{path}: more than {MAX_SOURCE_BYTES} bytes, over the 1 MiB a problem may be (real ones "
                           "are a few KB): check that this is the problem file you meant")
    try:
        source = decode_utf8(data, path)
    except InputEncodingError as exc:  # the same words as a tool's, as the problem file's error here
        raise ProblemError(str(exc)) from exc
    return parse_problem(source, name=name or path.stem, path=str(path.resolve()))
