"""Whose fault, on a real GPU (issue 24): a candidate's CUDA faults are its crash in its own words
wherever CUDA reports them (the checks, the timing loop, the census worker), its out-of-memory is
its crash where it holds more than its share, and the harness running out of memory through no
fault of the candidate's is no verdict at all. No summary may read "internal harness error" (the
autouse check in tests/conftest.py fails the test on one)."""

from __future__ import annotations

import pytest
from harness_helpers import FIXTURES, fixture_source

from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import load_problem
from kb_mcp.kb.models import Verdict

pytestmark = pytest.mark.gpu

QUICK = VerifyOptions(timing=False, compile_baseline=False)

# An honest ReLU whose forward can launch a faulty kernel and return without synchronizing: CUDA
# then reports the fault in whatever GPU call comes next, in the harness's code.
CANDIDATE = '''
import sys
import torch
import torch.nn as nn

RELU = r"""
extern "C" __global__ void relu_k(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
"""
BAD = r"""
extern "C" __global__ void bad(float* p) {
    BODY
}
"""


class ModelNew(nn.Module):
    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.k = torch.cuda._compile_kernel(RELU, "relu_k")
        self.bad = torch.cuda._compile_kernel(BAD, "bad")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n = x.numel()
        self.k(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, y, n])
        ModelNew.calls += 1
        if WHEN:
            self.bad(grid=(1, 1, 1), block=(32, 1, 1), args=[y])
        return y
'''
ILLEGAL = "p[threadIdx.x + (1ull << 40)] = 1.0f;"
MISALIGNED = "*(float4*)((char*)p + 4) = make_float4(0.f, 0.f, 0.f, 0.f);"
TRAP = 'asm volatile("trap;");'
# Not in the census worker (its own process, `--role census`), and past the checks' calls.
IN_TIMING = '"census" not in sys.argv and ModelNew.calls == 30'


def faulty(body: str, when: str = "True") -> str:
    """The candidate with a faulty kernel launched `when`, asynchronously."""
    return CANDIDATE.replace("BODY", body).replace("WHEN", when)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory):
    with WorkerPool(tmp_path_factory.mktemp("fault-cache")) as p:
        yield p


def _normal(pool: WorkerPool, problem) -> None:
    result = pool.verify(problem, fixture_source("relu_nvrtc.py"), QUICK)
    assert result.verdict in (Verdict.faster, Verdict.slower), result.summary


@pytest.mark.parametrize(("body", "words"), [
    (ILLEGAL, "an illegal memory access was encountered"),
    (MISALIGNED, "misaligned address"),
    (TRAP, "CUDA error"),
], ids=["illegal-address", "misaligned-address", "trap"])
def test_a_fault_reported_after_forward_returned_is_the_candidates_crash_in_its_words(
        pool: WorkerPool, relu_problem, body: str, words: str) -> None:
    restarts = pool.restarts
    result = pool.verify(relu_problem, faulty(body), QUICK)
    assert result.verdict == Verdict.crashed and result.not_judged == "", result.summary
    assert result.summary.startswith("crashed: ModelNew.forward (call 1 of the checks) raised a CUDA error"), \
        result.summary
    assert words in result.summary
    assert result.worker_replaced and pool.restarts == restarts + 1
    _normal(pool, relu_problem)


def test_a_fault_reported_in_the_timing_loop_names_the_timed_run(pool: WorkerPool, relu_problem) -> None:
    result = pool.verify(relu_problem, faulty(ILLEGAL, IN_TIMING), VerifyOptions(timed_runs=50,
                                                                                 compile_baseline=False))
    assert result.verdict == Verdict.crashed, result.summary
    assert "ModelNew.forward (timed run " in result.summary and "illegal memory access" in result.summary, \
        result.summary
    assert "reported in the harness's next GPU call, while timing ModelNew.forward" in result.summary
    _normal(pool, relu_problem)


def test_a_fault_only_in_the_census_worker_is_its_crash_there(pool: WorkerPool, relu_problem) -> None:
    census_restarts = pool.census_restarts
    result = pool.verify(relu_problem, faulty(ILLEGAL, '"census" in sys.argv'), QUICK)
    assert result.verdict == Verdict.crashed, result.summary
    assert "census worker" in result.summary and "illegal memory access" in result.summary, result.summary
    assert pool.census_restarts == census_restarts + 1
    _normal(pool, relu_problem)


HOARD = '''
import torch
import torch.nn as nn

RELU = r"""
extern "C" __global__ void relu_k(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
"""


class ModelNew(nn.Module):
    kept = []

    def __init__(self) -> None:
        super().__init__()
        self.k = torch.cuda._compile_kernel(RELU, "relu_k")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n = x.numel()
        self.k(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, y, n])
        if not ModelNew.kept:  # a cache that takes nearly everything the GPU has free
            free, _ = torch.cuda.mem_get_info()
            ModelNew.kept.append(torch.empty(free - (64 << 20), dtype=torch.uint8, device="cuda"))
        return y
'''


def test_a_candidate_holding_nearly_all_memory_is_blamed_when_the_harness_runs_out(
        pool: WorkerPool, relu_problem) -> None:
    result = pool.verify(relu_problem, HOARD, QUICK)
    assert result.verdict == Verdict.crashed and result.not_judged == "", result.summary
    # The allocation that fails next is the harness's (worded "ModelNew holds ... beyond its share")
    # or the candidate's own output (worded "ran out of GPU memory ... (ModelNew holds ..."): its crash.
    assert "ModelNew holds " in result.summary, result.summary
    held = float(result.summary.split("ModelNew holds ")[1].split(" GiB")[0])
    assert held > 10, result.summary  # nearly the whole GPU, measured
    assert result.worker_replaced
    _normal(pool, relu_problem)


def test_its_own_impossible_allocation_is_its_crash_and_costs_no_worker(pool: WorkerPool, relu_problem) -> None:
    huge = faulty(ILLEGAL, "False").replace("        y = torch.empty_like(x)\n",
                                          "        y = torch.empty_like(x)\n"
                                          "        torch.empty(1 << 47, dtype=torch.uint8, device='cuda')\n")
    result = pool.verify(relu_problem, huge, QUICK)
    assert result.verdict == Verdict.crashed and not result.not_judged, result.summary
    assert result.summary.startswith("crashed: ModelNew.forward (call 1 of the checks) ran out of GPU memory")
    # torch writes the size in GiB (2.11: "131072.00 GiB") or in TiB, by version
    assert ("131072.00 GiB" in result.summary or "128.00 TiB" in result.summary) and not result.worker_replaced


def test_the_harness_running_out_of_memory_through_no_fault_of_the_candidates_gives_no_verdict(
        tmp_path) -> None:
    """The problem leaves 768 MiB of the GPU free (as other processes would): the harness's own input
    sets do not fit, and the honest candidate, holding nothing, is not judged."""
    problem = load_problem(FIXTURES / "memory_hog_problem.py")
    with WorkerPool(tmp_path, spare=False) as own:
        own.state()  # every worker of the pool started (their CUDA contexts taken) before the problem fills the GPU
        result = own.verify(problem, fixture_source("relu_nvrtc.py"), QUICK)
    # Refused up front as too large for the memory left, or run until the harness ran out: either
    # way nothing is held against the candidate.
    assert result.not_judged or result.problem_error, result.summary
    if result.not_judged:
        assert result.not_judged in result.summary
        assert result.summary.startswith("not judged: the GPU ran out of memory while "), result.summary
        assert "the machine's limit, not the candidate's fault" in result.summary and "asked" in result.summary
