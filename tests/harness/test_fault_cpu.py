"""Whose fault an exception is (`harness.worker.fault`), on CPU: real exceptions raised through real
files of a candidate and a problem, and the memory rule on the numbers a GPU reports."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kb_mcp.harness.judgment.verdict import Evidence, Failure, FailureKind, GpuMemory, judge
from kb_mcp.harness.worker.fault import (
    WORKSPACE_BYTES,
    Blame,
    Halted,
    ProblemBroken,
    asked_bytes,
    is_cuda_error,
    is_out_of_memory,
    memory_fault,
)
from kb_mcp.harness.worker.loading import load_module
from kb_mcp.kb.models import Verdict

GIB = 1 << 30
OOM = ("CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 5.16 GiB "
       "is free. Including non-PyTorch memory, this process has 710.00 MiB memory in use.")
ILLEGAL = "CUDA error: an illegal memory access was encountered"


def test_the_kinds_of_cuda_errors_are_told_apart() -> None:
    assert is_out_of_memory(torch.OutOfMemoryError(OOM)) and is_cuda_error(torch.OutOfMemoryError(OOM))
    assert is_out_of_memory(torch.AcceleratorError("CUDA error: out of memory"))
    for text in (ILLEGAL, "CUDA error: misaligned address", "CUDA error: device-side assert triggered",
                 "CUDA error: unspecified launch failure", "CUDA error: an illegal instruction was encountered"):
        assert is_cuda_error(torch.AcceleratorError(text)) and not is_out_of_memory(torch.AcceleratorError(text))
    assert not is_cuda_error(ValueError("shapes differ")) and not is_out_of_memory(KeyError("x"))


def test_what_an_allocation_asked_for_is_read_from_torchs_message() -> None:
    assert asked_bytes(OOM) == 6 * GIB
    assert asked_bytes("Tried to allocate 512.00 MiB.") == 512 << 20
    assert asked_bytes("Tried to allocate 20 B") == 20
    assert asked_bytes("CUDA error: out of memory") is None


def _memory(asked: float | None, free: float, held: float, share: float) -> GpuMemory:
    return GpuMemory(asked=None if asked is None else int(asked * GIB), free=int(free * GIB), total=80 * GIB,
                     held=int(held * GIB), share=int(share * GIB), process=int(held * GIB))


@pytest.mark.parametrize(("asked", "free", "held", "share", "own_call", "candidates"), [
    # the harness's allocation: the candidate's fault only where its share would have left room
    (6, 5.16, 0.0, 24.5, False, False),  # issue 24: other processes held the GPU
    (1, 0.05, 75, 1.5, False, True),  # it hoards nearly the whole GPU
    (1, 0.5, 1.4, 1.5, False, False),  # within its share
    (1, 0.5, 2.2, 1.5, False, True),  # 0.7 GiB beyond its share would have covered the 0.5 GiB missing
    (None, 0.1, 2, 1.5, False, True),  # a CUDA call's allocation of unknown size, beside a hoard
    # its own allocation: its fault where the device gave it its share and it wanted more
    (128 * 1024, 78, 0, 0.6, True, True),  # a size bug: 128 TiB
    (0.01, 0.005, 0.001, 0.6, True, False),  # its output, on a GPU others filled
    (4, 3, 0.2, 24.5, True, False),  # a big problem's output while the harness held the rest
    (54, 40, 0, 25, True, True),  # a workspace beyond what 40 GiB free gave it
    (1, 2, 0, 0.6, True, True),  # the device had room: not a shortage of the machine's
    (None, 0.001, 0, 0.6, True, True),  # its own cudaMalloc, size unknown
])
def test_running_out_of_memory_is_the_candidates_fault_only_beyond_its_share(
        asked: float | None, free: float, held: float, share: float, own_call: bool, candidates: bool) -> None:
    assert memory_fault(_memory(asked, free, held, share), own_call) is candidates


@pytest.fixture
def files(tmp_path: Path) -> tuple[object, object]:
    """A candidate module and a problem module loaded from real files (their frames are in tracebacks)."""
    cand = load_module("def forward(x):\n    return x.no_such_method()\n\ndef run(f):\n    return f()\n",
                       "kbmcp_candidate_fault_test", tmp_path)
    prob = load_module("def forward(x):\n    raise ValueError('the problem refuses ' + str(x))\n",
                       "kbmcp_problem_fault_test", tmp_path)
    return cand, prob


def _blame(cand: object, prob: object) -> Blame:
    blame = Blame()
    blame.candidate_files = (str(getattr(cand, "__file__", "")),)
    blame.problem_files = (str(getattr(prob, "__file__", "")),)
    blame.started(cuda=False)
    blame.checked_call()
    return blame


def _raised(fn: object, *args: object) -> BaseException:
    try:
        fn(*args)  # type: ignore[operator]
    except BaseException as exc:  # noqa: BLE001 - the exception is the subject
        return exc
    raise AssertionError("it did not raise")


def test_an_exception_through_the_candidates_code_is_its_crash(files: tuple[object, object]) -> None:
    cand, prob = files
    blame = _blame(cand, prob)
    halted = blame.halt(_raised(cand.forward, 3), "running ModelNew.forward on the input sets")  # type: ignore[attr-defined]
    assert isinstance(halted, Halted) and halted.failure.kind == FailureKind.raised
    assert halted.failure.where == "ModelNew.forward (call 1 of the checks)"
    assert "AttributeError" in halted.failure.detail and "line 2" in halted.failure.detail
    # a harness function called back by the candidate raising is still inside the candidate's call
    inside = blame.halt(_raised(cand.run, lambda: {}["k"]), "timing")  # type: ignore[attr-defined]
    assert isinstance(inside, Halted) and inside.failure.kind == FailureKind.raised


def test_an_exception_of_the_problems_own_code_is_the_problems(files: tuple[object, object]) -> None:
    cand, prob = files
    broken = _blame(cand, prob).halt(_raised(prob.forward, 7), "timing")  # type: ignore[attr-defined]
    assert isinstance(broken, ProblemBroken) and broken.failure.stage == "reference"
    assert "the problem refuses 7" in broken.failure.text and "its Model raised" in broken.failure.text


def test_a_defect_of_the_harness_is_not_blamed_on_anyone(files: tuple[object, object]) -> None:
    cand, prob = files
    assert _blame(cand, prob).halt(_raised(lambda: {}["key"]), "timing") is None
    before = Blame()  # nothing of the candidate ran yet: whatever happens is not its doing
    assert before.halt(_raised(cand.forward, 1), "importing") is None  # type: ignore[attr-defined]


def test_a_cuda_error_surfacing_in_the_harness_is_named_after_the_candidates_last_call(
        files: tuple[object, object]) -> None:
    cand, prob = files
    blame = _blame(cand, prob)
    blame.calling("ModelNew.forward (timed run 3)")

    def compare() -> None:  # the harness's own code, where CUDA reports the kernel's fault
        raise torch.AcceleratorError(ILLEGAL)

    halted = blame.halt(_raised(compare), "timing ModelNew.forward")
    assert isinstance(halted, Halted) and halted.retire
    f = halted.failure
    assert f.kind == FailureKind.cuda_error and f.where == "ModelNew.forward (timed run 3)"
    assert ILLEGAL in f.detail and "while timing ModelNew.forward" in f.detail
    verdict, summary = f.judged(Evidence())
    assert verdict == Verdict.crashed
    assert summary.startswith("crashed: ModelNew.forward (timed run 3) raised a CUDA error")
    assert "internal" not in summary


def test_an_interrupt_after_the_candidate_ran_is_its_exit(files: tuple[object, object]) -> None:
    cand, prob = files

    def interrupted() -> None:  # what a thread of the candidate's calling `_thread.interrupt_main()` causes
        raise KeyboardInterrupt

    halted = _blame(cand, prob).halt(_raised(interrupted), "timing")
    assert isinstance(halted, Halted) and halted.failure.kind == FailureKind.exited and halted.retire


def test_the_harness_running_out_of_memory_with_a_modest_candidate_stores_nothing(
        files: tuple[object, object]) -> None:
    cand, prob = files
    blame = _blame(cand, prob)
    blame.set_bytes = lambda: 3 * GIB  # one input set and its output: the share is 6.5 GiB
    released: list[bool] = []
    blame.release = lambda: released.append(True)

    def make_inputs() -> None:
        raise torch.OutOfMemoryError(OOM)

    halted = blame.halt(_raised(make_inputs), "timing ModelNew.forward")
    assert isinstance(halted, Halted) and released == [True]
    f = halted.failure
    assert f.kind == FailureKind.harness_out_of_memory and f.memory is not None
    assert f.memory.asked == 6 * GIB and f.memory.share == 6 * GIB + WORKSPACE_BYTES
    judged = judge(Evidence(failure=f))
    assert judged.not_judged and judged.summary.startswith("not judged: the GPU ran out of memory while timing")
    assert "6.00 GiB asked" in judged.summary and "nothing was stored" in judged.summary


def test_judge_words_the_memory_numbers_for_each_owner() -> None:
    hoard = GpuMemory(asked=GIB, free=50 << 20, total=80 * GIB, held=75 * GIB, share=GIB, process=76 * GIB)
    hoarded = judge(Evidence(failure=Failure(kind=FailureKind.memory_hoarded, where="ModelNew.forward (call 1 of "
                                             "the checks)", memory=hoard)))
    assert hoarded.verdict == Verdict.crashed and not hoarded.not_judged
    assert hoarded.summary.startswith("crashed: ModelNew holds 75.00 GiB of GPU memory after ModelNew.forward (call 1")
    assert "could not allocate 1.00 GiB (0.05 GiB of 80.00 GiB free)" in hoarded.summary
    own = judge(Evidence(failure=Failure(kind=FailureKind.out_of_memory, where="ModelNew.forward (timed run 0)",
                                         detail="CUDA out of memory. Tried to allocate 128.00 TiB.", memory=GpuMemory(
                                             asked=128 << 40, free=78 * GIB, total=80 * GIB, share=GIB))))
    assert own.summary.startswith("crashed: ModelNew.forward (timed run 0) ran out of GPU memory: CUDA out of memory")
    machine = judge(Evidence(failure=Failure(kind=FailureKind.harness_out_of_memory, where="timing", memory=GpuMemory(
        asked=6 * GIB, free=5 * GIB, total=80 * GIB, held=0, share=25 * GIB, process=GIB))))
    assert machine.not_judged and "other processes 74.00 GiB" in machine.summary
