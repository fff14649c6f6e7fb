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
from typing import Any


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


def with_model_weights(cand: Any, ref: Any, composed: bool) -> Any:
    """Composed mode: the candidate for a model given the model's own weights at the model's names.

    A candidate composed from parts (`decomposition.compose`) creates each part's parameters in its own
    order, so seeded construction alone cannot give it the reference's values. In composed mode each
    reference parameter and buffer is copied into the candidate's tensor of the same dotted name, shape,
    dtype and device, in place (the candidate's own tensors and hooks stay); tensors of other names keep
    what the candidate made. The candidate learns nothing it would not hold after seeded construction of
    the same layers, and the perturbation check maps these tensors by name as ever. Own mode: unchanged."""
    if composed:
        share_reference_state(ref, cand)
    return cand


def share_reference_state(ref: Any, cand: Any) -> list[str]:
    """Copies the reference's parameters and buffers into the candidate's tensors of the same name,
    shape, dtype and device; returns the names copied."""
    import torch

    theirs = {**dict(ref.named_parameters()), **dict(ref.named_buffers())}
    copied = []
    with torch.no_grad():
        for name, mine in [*cand.named_parameters(), *cand.named_buffers()]:
            src = theirs.get(name)
            if src is None or src.shape != mine.shape or src.dtype != mine.dtype or src.device != mine.device:
                continue
            mine.copy_(src)
            copied.append(name)
    return copied
