"""Importing user code (problems, candidates) from source text inside a worker or driver process.

Code is written to a real file and imported from it, so tracebacks point at lines,
`inspect.getsource` works, and `load_inline` can locate the calling module.
"""

from __future__ import annotations

import importlib.util
import sys
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
