"""Whose fault an exception is, once the candidate's code has run in this process (worker side; imports torch).

`Blame.halt` is the one place a verification decides who an exception raised after the
candidate's code ran belongs to (the GPU pipeline's stage loop calls it for every stage; the census
worker for its harness-side allocations):

* **the candidate**: an exception raised while its code was on the stack (a frame of its file in
  the traceback: its import, constructor or forward); an exit or interrupt; and any CUDA error
  other than running out of memory (an illegal or misaligned address, a device-side assert or trap,
  an illegal instruction, a launch failure) wherever it surfaces. CUDA reports a kernel's fault at
  the next call that synchronizes, often in the harness's own code (a comparison, the timer, the L2
  flush), so the failure is named after the candidate's last call (`Blame.calling`: "ModelNew.forward
  (timed run 3)"), which the harness records before every call it makes of the candidate;
* **the problem**: a Python exception from the problem's own code with no frame of the candidate's
  in it (`ProblemBroken`: no verdict on the candidate);
* **the machine**: running out of GPU memory where the candidate is not to blame (below):
  `harness_out_of_memory`, no verdict, nothing stored. Where the allocation that failed was another
  harness process's (the census worker's), the candidate's holdings in the verifying process are
  weighed the same way (`Blame.beside`);
* **ours**: anything else the harness's own code raises is a defect of the harness. `halt` returns
  None and the worker reports an internal harness error.

GPU memory is measured, not guessed. What the candidate holds (`GpuMemory.held`) is what the
caching allocator has allocated once the harness has let go of what it held for the failed step
(the traceback's frames cleared, `Blame.release`), less the level right before the candidate's
import; its share is the reference's parameters and buffers, two input sets with their outputs and
`WORKSPACE_BYTES`. The candidate is at fault when the device gave it at least its share and it
wanted more (`memory_fault`): its own allocation failed although what it holds plus what was free
reached its share (or the device had room, or the size is unknown: an allocation outside PyTorch's
allocator), or the harness's allocation failed and would have fit had the candidate kept to its
share. Memory a candidate takes outside PyTorch's allocator (its own `cudaMalloc`) is not counted
in what it holds.
"""

from __future__ import annotations

import gc
import re
import traceback
from collections.abc import Callable
from typing import Any

import torch

from kb_mcp.harness.gpu.memory import TooLarge
from kb_mcp.harness.judgment.verdict import Failure, FailureKind, GpuMemory
from kb_mcp.harness.protocol import ProblemFailed
from kb_mcp.harness.worker.loading import short_traceback

__all__ = ["WORKSPACE_BYTES", "Blame", "Halted", "ProblemBroken", "asked_bytes", "context_healthy", "first_line",
           "is_cuda_error", "is_out_of_memory", "memory_fault", "raised_in", "tensor_bytes"]

WORKSPACE_BYTES = 512 << 20  # what any candidate may hold beyond its inputs' size: scratch buffers, its caches
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_ASKED = re.compile(r"Tried to allocate ([0-9.]+) ?(B|KiB|MiB|GiB|TiB)")


class Halted(Exception):
    """Unwinds a verification's stage when the candidate (or the problem's Model, or the machine)
    ended it. It carries the evidence, not a verdict: the stage loop collects `failure` and
    `verdict.judge` decides."""

    def __init__(self, failure: Failure, retire: bool = False) -> None:
        super().__init__(failure.detail)
        self.failure = failure
        self.retire = retire


class ProblemBroken(Exception):
    """The problem's own code failed: before any candidate code ran, or later with no frame of the
    candidate's in the traceback."""

    def __init__(self, stage: str, exc: BaseException | None, files: tuple[str, ...] = (),
                 too_large: TooLarge | None = None) -> None:
        super().__init__(stage)
        error = short_traceback(exc, files) if exc is not None else ""
        self.failure = ProblemFailed(stage=stage, error=error or (too_large.text if too_large else ""),
                                     too_large=too_large)


def is_out_of_memory(exc: BaseException) -> bool:
    """The GPU (or an allocation on it) ran out of memory: PyTorch's allocator, or a CUDA call."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)


def is_cuda_error(exc: BaseException) -> bool:
    """A CUDA error (running out of memory included): the driver's or the runtime's, as torch raises it."""
    text = str(exc)
    return (type(exc).__name__ in ("AcceleratorError", "CudaError", "OutOfMemoryError") or "CUDA error" in text
            or "cudaError" in text)


def asked_bytes(message: str) -> int | None:
    """What a failed allocation asked for, from PyTorch's message ("Tried to allocate 6.00 GiB")."""
    m = _ASKED.search(message)
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def memory_fault(m: GpuMemory, own_call: bool) -> bool:
    """True when running out of GPU memory is the candidate's fault (see the module's docstring):
    `own_call`, an allocation made while its code ran; else one of the harness's."""
    if own_call:
        if m.asked is None or m.free >= m.asked:
            return True
        return m.held + m.free >= m.share
    return m.held + m.free >= m.share + (m.asked or 0)


def first_line(exc: BaseException) -> str:
    """The exception's first line, briefly."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def context_healthy() -> bool:
    """Whether the CUDA context still computes correctly (after a CUDA error it often does not)."""
    try:
        torch.cuda.synchronize()
        x = torch.ones(8, device="cuda")
        return float((x + 1).sum().item()) == 16.0
    except Exception:  # noqa: BLE001 - any CUDA failure means the context is unusable
        return False


def raised_in(exc: BaseException, files: tuple[str, ...]) -> bool:
    """Whether the traceback has a frame of one of `files` (raised while that code was on the stack)."""
    if not files:
        return False
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in files:
            return True
        tb = tb.tb_next
    return False


class Blame:
    """One process's record of the candidate's calls, and the one place that decides whose fault
    an exception is once they began (see the module's docstring)."""

    def __init__(self, compiled_ok: Callable[[], bool] = lambda: True) -> None:
        """`compiled_ok()` says whether the candidate's builds succeeded (an exception after a failed
        build is that build's consequence)."""
        self.compiled_ok = compiled_ok
        self.candidate_files: tuple[str, ...] = ()
        self.problem_files: tuple[str, ...] = ()
        self.last = ""  # the candidate's last call, as a summary names it
        self.ran = False  # the candidate's code has run in this process
        self.base = 0  # allocator bytes right before the candidate's import
        self.reference_bytes = 0  # the reference's parameters and buffers
        self.set_bytes: Callable[[], int] = lambda: 0  # one input set with its outputs
        self.release: Callable[[], None] = lambda: None  # drops what the harness keeps for the failed step
        self.checks = 0  # calls of ModelNew.forward in the checks

    # -- what the harness records as it goes ---------------------------------------------------

    def started(self, cuda: bool) -> None:
        """The candidate's code is about to run for the first time: the allocator's level now is
        the harness's own."""
        self.ran = True
        self.base = torch.cuda.memory_allocated() if cuda else 0

    def calling(self, where: str) -> None:
        """The harness is about to call the candidate (`where`: "ModelNew.forward (timed run 3)");
        cheap enough to call outside any timed region before every call."""
        self.last = where
        self.ran = True

    def checked_call(self) -> None:
        """The next call of ModelNew.forward in the checks."""
        self.checks += 1
        self.calling(f"ModelNew.forward (call {self.checks} of the checks)")

    @property
    def share(self) -> int:
        """The GPU memory the candidate may hold (see the module's docstring)."""
        return self.reference_bytes + 2 * self.set_bytes() + WORKSPACE_BYTES

    # -- the decision -----------------------------------------------------------------------------

    def halt(self, exc: BaseException, doing: str) -> Halted | ProblemBroken | None:
        """What `exc`, raised while the harness was `doing` something after the candidate's code ran,
        is evidence of; None for a defect of the harness's own (re-raise it)."""
        if not self.ran:
            return None
        if raised_in(exc, self.candidate_files) or isinstance(exc, (SystemExit, KeyboardInterrupt)):
            return self.inside(exc, self.last)
        if is_out_of_memory(exc):
            return self.out_of_memory(exc, own_call=False, where=f"{doing} (the harness's own allocation)")
        if is_cuda_error(exc):
            detail = f"{first_line(exc)} (reported in the harness's next GPU call, while {doing})"
            return Halted(Failure(kind=FailureKind.cuda_error, where=self.last, detail=detail,
                                  context_healthy=context_healthy()), retire=True)
        if raised_in(exc, self.problem_files):
            return ProblemBroken("reference", exc, self.problem_files)
        return None

    def inside(self, exc: BaseException, where: str) -> Halted:
        """An exception raised while the candidate's code ran (`where`): a build that failed, bad
        syntax, running out of memory, a CUDA error, an exit, or anything else it raised."""
        def failed(kind: FailureKind, detail: str = "", retire: bool = False, healthy: bool = True) -> Halted:
            return Halted(Failure(kind=kind, where=where, detail=detail, context_healthy=healthy), retire)

        if not self.compiled_ok():
            return failed(FailureKind.build_failed)
        if isinstance(exc, SyntaxError):
            return failed(FailureKind.syntax_error, f"Python syntax error at line {exc.lineno}: {exc.msg}")
        if is_out_of_memory(exc):
            return self.out_of_memory(exc, own_call=True, where=where)
        if is_cuda_error(exc):
            # Even a context that still answers may hold the candidate's stray state: replace the worker.
            return failed(FailureKind.cuda_error, first_line(exc), retire=True, healthy=context_healthy())
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            return failed(FailureKind.exited, type(exc).__name__, retire=True)
        return failed(FailureKind.raised, short_traceback(exc, self.candidate_files), retire=not context_healthy())

    def out_of_memory(self, exc: BaseException, own_call: bool, where: str) -> Halted:
        """Running out of GPU memory, measured and attributed (`memory_fault`). A worker whose
        candidate still holds more than its share is replaced (memory its extension keeps would stay
        with the process); otherwise the worker lost nothing."""
        memory = self.measure(exc)
        if not memory_fault(memory, own_call):
            kind = FailureKind.harness_out_of_memory
        else:
            kind = FailureKind.out_of_memory if own_call else FailureKind.memory_hoarded
            where = where if own_call else self.last
        return Halted(Failure(kind=kind, where=where, detail=first_line(exc), memory=memory),
                      retire=memory.held > memory.share)

    def beside(self, failure: Failure, where: str) -> Halted | None:
        """How another process of the harness (the census worker) failed, weighed here: where it
        ran out of memory while the candidate holds memory in this one, the candidate's fault, as
        for an allocation of the harness's here, when it holds more than its share and keeping to it
        would have left the other allocation room. None where not (that process's failure stands)."""
        other = failure.memory
        if failure.kind != FailureKind.harness_out_of_memory or other is None:
            return None
        self.release()
        gc.collect()
        if not (self.ran and torch.cuda.is_available()):
            return None
        here = GpuMemory(asked=other.asked, free=other.free, total=other.total, held=self.still_held(),
                         share=self.share, process=torch.cuda.memory_reserved())
        if here.held <= here.share or not memory_fault(here, own_call=False):
            return None
        return Halted(Failure(kind=FailureKind.memory_hoarded, where=self.last or where,
                              detail=f"{where} ran out of GPU memory", memory=here), retire=True)

    def still_held(self) -> int:
        """What the candidate's code holds in this process's allocator now (0 before it ran)."""
        if not self.ran or not torch.cuda.is_available():
            return 0
        return max(0, torch.cuda.memory_allocated() - self.base)

    def measure(self, exc: BaseException) -> GpuMemory:
        """The device's memory now, and what the candidate holds once the harness let go of what the
        failed step held (its frames' tensors, `release`)."""
        traceback.clear_frames(exc.__traceback__)
        self.release()
        gc.collect()
        if not torch.cuda.is_available():
            return GpuMemory(asked=asked_bytes(str(exc)), share=self.share)
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda: 1.0)()  # torch >= 2.5
        if fraction < 1.0:  # this process may use only part of the device (`set_per_process_memory_fraction`)
            free = min(free, max(0, int(fraction * total) - reserved))
        return GpuMemory(asked=asked_bytes(str(exc)), free=int(free), total=int(total),
                         held=self.still_held(), share=self.share, process=reserved)


def tensor_bytes(values: Any) -> int:
    """Bytes of the tensors among `values` (an input set, a model's state)."""
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))
