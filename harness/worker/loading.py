"""Importing user code (problems, candidates) from source text inside a worker or driver process
(worker side: only ever inside the sandbox).

Code is written to a real file and imported from it, so tracebacks point at lines,
`inspect.getsource` works, and `load_inline` can locate the calling module.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType


def load_module(source: str, module_name: str, directory: Path) -> ModuleType:
    """Writes `source` to `directory/module_name.py`, imports it fresh and returns the module."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module_name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - only for non-.py paths
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def short_traceback(exc: BaseException, files: tuple[str, ...]) -> str:
    """The exception with the last lines of `files` (user code) it passed through."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in files]
    where = "; ".join(f"line {f.lineno}: {(f.line or '').strip()[:120]}" for f in frames[-3:])
    text = f"{type(exc).__name__}: {str(exc).strip()[:1500]}"
    return f"{text} (at {where})" if where else text
