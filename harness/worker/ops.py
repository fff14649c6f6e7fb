"""The op recorder (a TorchDispatchMode around each checked forward: every ATen op it runs, with the
candidate's line, and whether a compute op was among them) and the checks of ModelNew against the
reference class (worker side)."""

from __future__ import annotations

import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kb_mcp.harness.baselines import ReferenceOpsCache
from kb_mcp.harness.judgment.kernels import ALLOWED_OPS, NOOP_ONLY_OPS, TORCH_NAMESPACES
from kb_mcp.harness.judgment.verdict import Finding, FindingCode
from kb_mcp.harness.worker.values import secret_seed

_THIS_DIR = str(Path(__file__).resolve().parent)
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


@dataclass
class OpEvent:
    """One op executed under the recorder: its name and the candidate line that issued it."""

    name: str  # e.g. "aten::mm" or "mylib::fused"
    packet: str  # overload-packet name, e.g. "mm"
    namespace: str
    allowed: bool
    where: str | None = None  # "file.py:42"
    line: int | None = None


def _caller_line(candidate_file: str | None) -> tuple[str | None, int | None]:
    """The innermost frame in the candidate's file (or, without one, outside torch and the harness)."""
    frame: FrameType | None = sys._getframe(2)
    fallback: tuple[str | None, int | None] = (None, None)
    while frame is not None:
        filename = frame.f_code.co_filename
        if candidate_file is not None and filename == candidate_file:
            return f"{Path(filename).name}:{frame.f_lineno}", frame.f_lineno
        if (
            fallback == (None, None)
            and not filename.startswith(_TORCH_DIR)
            and not filename.startswith(_THIS_DIR)
            and not filename.startswith("<")
        ):
            fallback = (f"{Path(filename).name}:{frame.f_lineno}", frame.f_lineno)
        frame = frame.f_back
    return fallback if candidate_file is None else (None, None)


class OpRecorder(TorchDispatchMode):
    """Records the ATen ops a call executes and flags PyTorch compute ops.

    Composite ops are seen as the dispatcher presents them (`linear` under inference mode, its
    `addmm` decomposition otherwise); both spellings are library calls. Ops of other namespaces are
    the candidate's own registered custom ops and are allowed; whatever they call inside is seen by
    `census` (the profiler), not here.
    """

    def __init__(self, allow: Collection[str] = (), candidate_file: str | None = None,
                 kept: Collection[str] = ()) -> None:
        super().__init__()
        self.allow = frozenset(allow)
        self.candidate_file = candidate_file
        # Composed mode: the reference's own compute ops (`ns::packet`, `harness.judgment.composed`), allowed as well
        self.kept = frozenset(kept)
        self.events: list[OpEvent] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket.__name__
        namespace = getattr(func, "namespace", "aten")
        if (namespace not in TORCH_NAMESPACES or packet in ALLOWED_OPS or packet in self.allow
                or f"{namespace}::{packet}" in self.kept):
            allowed = True
        elif packet in NOOP_ONLY_OPS:
            allowed = any(out is a for a in args)
        else:
            allowed = False
        where, line = _caller_line(self.candidate_file) if not allowed else (None, None)
        self.events.append(OpEvent(f"{namespace}::{packet}", packet, namespace, allowed, where, line))
        return out

    def banned(self) -> list[OpEvent]:
        """The library compute ops recorded so far."""
        return [e for e in self.events if not e.allowed]

    def findings(self) -> list[Finding]:
        """One `library_call` finding per distinct banned op, with a count and source lines."""
        by_op: dict[str, list[OpEvent]] = {}
        for e in self.banned():
            by_op.setdefault(e.name, []).append(e)
        out: list[Finding] = []
        for name, events in by_op.items():
            lines = sorted({e.where for e in events if e.where})
            at = (f" at {', '.join(lines[:5])}" if lines
                  else " (no line in the candidate file: issued from compiled or library code)")
            out.append(
                Finding(
                    code=FindingCode.library_call,
                    message=(
                        f"ModelNew.forward ran the PyTorch op {name} ({len(events)}x){at}; compute it in "
                        "your own kernel (allocation, views and kernel launches are fine) or run with an "
                        "allow-list that permits it"
                        if not self.kept else
                        f"ModelNew.forward ran the PyTorch op {name} ({len(events)}x){at}, which the reference "
                        "never runs; composed mode keeps only the reference's own ops "
                        f"({', '.join(sorted(self.kept)[:8])}{', ...' if len(self.kept) > 8 else ''}): compute "
                        "it in your own kernel, or keep the reference's ops as it runs them"
                    ),
                    source="runtime",
                    line=next((e.line for e in events if e.line), None),
                )
            )
        return out



def record_ops(call: Any) -> list[str]:
    """The compute ops (`ns::packet`) one call runs, as the op recorder sees them: the reference's
    own op set in composed mode (`harness.judgment.composed`), recorded before any candidate code runs."""
    recorder = OpRecorder()
    with recorder:
        call()
    return sorted({e.name for e in recorder.banned()})


def reference_dispatch_ops(env: Any, problem_hash: str, track: str, pmod: Any, ref: Any,
                           guard: Any) -> list[str] | None:
    """Composed mode: the reference's own op set at the op recorder's level (`harness.judgment.composed`), from
    the cache, else recorded on one input set of the problem (secret seed, on the GPU, no autograd)
    before any candidate code runs; the guard (`IntegrityGuard.compose`) allows it from then on.
    Returns what was recorded here, for the cache (None: it came from the cache)."""
    cached = ReferenceOpsCache(env.cache_dir).get(problem_hash, env.device, env.torch_version, track)
    if cached is not None and cached.dispatch is not None:
        guard.compose(cached.dispatch, None)
        return None
    torch.manual_seed(secret_seed())
    with torch.device("cuda"):
        xs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in pmod.get_inputs()]
    with torch.no_grad():
        ops = record_ops(lambda: ref(*xs))
    guard.compose(ops, None)
    return ops


def check_model_class(model_new: type, reference: type | None) -> list[Finding]:
    """`reference_fallback` if ModelNew subclasses the reference (or any class named Model)."""
    findings: list[Finding] = []
    for base in model_new.__mro__[1:]:
        if base is reference or (base.__name__ == "Model" and base.__module__ != "torch.nn.modules.module"):
            findings.append(
                Finding(
                    code=FindingCode.reference_fallback,
                    message=(
                        f"ModelNew subclasses `{base.__module__}.{base.__name__}`, the reference; it must "
                        "compute the result itself"
                    ),
                    source="runtime",
                )
            )
            break
    return findings


def check_model_instance(model: torch.nn.Module, reference: type | None) -> list[Finding]:
    """`reference_fallback` if a ModelNew instance holds a reference Model inside it."""
    if reference is None:
        return []
    for name, sub in model.named_modules():
        if sub is not model and isinstance(sub, reference):
            return [
                Finding(
                    code=FindingCode.reference_fallback,
                    message=f"ModelNew holds an instance of the reference Model as `{name}`; it must compute the "
                            "result itself",
                    source="runtime",
                )
            ]
    return []
