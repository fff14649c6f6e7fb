"""GPU memory as a resource of the pool, on a GPU: the footprint before anything runs, a refusal with
numbers where even eager cannot fit, one input set at a time, and a peak within the stated bound
(`memory.bound`: eager's peak, two of the larger of an input set and an output, with the checks on
the device one input set more, and `FIXED_OVERHEAD_BYTES`, every harness process together), on the
device path and on the host path alike."""

from __future__ import annotations

from typing import Literal

import pytest
from harness_helpers import fixture_source

from kb_mcp.harness.gpu.memory import GIB, bound
from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import parse_problem
from kb_mcp.kb.models import Verdict
from kb_mcp.tools import compile_and_verify as tool
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext

pytestmark = pytest.mark.gpu

RELU = """
import torch
import torch.nn as nn

ROWS, COLS = {rows}, {cols}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
"""

BIG = parse_problem(RELU.format(rows=1 << 15, cols=1 << 14), name="relu_2gib")  # 2 GiB in, 2 GiB out
HUGE = parse_problem(RELU.format(rows=1 << 22, cols=1 << 14), name="relu_256gib")  # more than any GPU holds


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory):
    with WorkerPool(tmp_path_factory.mktemp("memory-cache")) as p:
        yield p


def test_a_problem_too_large_even_for_eager_is_refused_before_it_allocates(pool: WorkerPool) -> None:
    result = pool.verify(HUGE, fixture_source("relu_nvrtc.py"))
    assert result.too_large is not None and result.too_large.what == "eager", result.summary
    assert result.problem_error and "too large for this GPU" in result.problem_error
    assert "256.0 GiB" in result.problem_error and "GiB free of" in result.problem_error
    assert result.elapsed_s < 60  # sized on the meta device: nothing of 256 GiB was made
    # the pool is fine afterwards
    ok = pool.verify(BIG, fixture_source("relu_nvrtc.py"), VerifyOptions(compile_baseline=False))
    assert ok.verdict in (Verdict.faster, Verdict.slower), ok.summary


def test_through_the_tool_a_too_large_problem_stores_nothing(tmp_path) -> None:
    problem = tmp_path / "relu_256gib.py"
    problem.write_text(HUGE.source)
    ctx = ToolContext(tmp_path / "kb.json", cache_dir=tmp_path / "cache")
    try:
        with pytest.raises(ToolError, match="cannot be verified on this GPU") as caught:
            tool.run(ctx, tool.Request(problem=str(problem), candidate=fixture_source("relu_nvrtc.py")))
        assert "Nothing was recorded" in str(caught.value) and "GiB free of" in str(caught.value)
        with ctx.store.read() as kb:
            assert kb.list_candidates() == []
    finally:
        ctx.close()


@pytest.mark.parametrize("checks_on", ["auto", "host"])
def test_a_large_problem_verifies_one_set_at_a_time_within_the_bound(
        pool: WorkerPool, checks_on: Literal["auto", "host"]) -> None:
    result = pool.verify(BIG, fixture_source("relu_nvrtc.py"), VerifyOptions(checks_on=checks_on))
    assert result.verdict in (Verdict.faster, Verdict.slower), result.summary
    assert not result.findings and all(s.passed for s in result.input_sets), result.summary
    memory = result.memory
    assert memory is not None
    fp = memory.footprint
    assert fp.method == "meta" and fp.input_bytes == 2 << 30 and fp.output_bytes == 2 << 30
    # the checks run on the device wherever it holds two sets (an H200 does); the host path on request
    assert memory.plan.pristine == ("host" if checks_on == "host" else "device"), memory.plan
    assert fp.eager_peak_bytes is not None and (4 << 30) <= fp.eager_peak_bytes <= (4 << 30) + (256 << 20)
    assert memory.verify_peak_bytes is not None and memory.verify_peak_bytes <= memory.plan.needed_bytes
    # eager's peak, two of the larger of a set and an output, the fixed overhead (and on the device
    # path the pristine copy of one set)
    limit = bound(fp, memory.plan.pristine)
    if memory.device_peak_bytes is not None:  # NVML: every process on the device
        assert memory.device_idle_bytes is not None
        taken = memory.device_peak_bytes - memory.device_idle_bytes
        stages = {k: round(v / GIB, 2) for k, v in memory.stage_peak_bytes.items()}
        print(f"checks on the {memory.plan.pristine}: device peak above idle {taken / GIB:.2f} GiB; "
              f"bound {limit / GIB:.2f} GiB; "
              f"verify worker {memory.verify_peak_bytes / GIB:.2f} GiB (by stage {stages}); "
              f"census {memory.census_peak_bytes}")
        for sp in memory.set_peaks:
            print(f"  sets {sp.sets}: at start {sp.start_bytes / GIB:.2f}, live {sp.allocated_bytes / GIB:.2f} GiB, "
                  f"reserved {sp.reserved_bytes / GIB:.2f} GiB")
        worst = max(sp.reserved_bytes for sp in memory.set_peaks)
        assert worst <= memory.stage_peak_bytes["check"]
        assert "check" in stages and "timing" in stages, stages
        assert taken <= limit, (taken / GIB, limit / GIB, stages)
    else:
        assert memory.verify_peak_bytes + (memory.census_peak_bytes or 0) <= limit


def test_after_a_verification_no_worker_holds_large_allocations(pool: WorkerPool) -> None:
    import torch

    pool.verify(BIG, fixture_source("relu_nvrtc.py"), VerifyOptions(compile_baseline=False))
    free, total = torch.cuda.mem_get_info()
    # idle: only the CUDA contexts of the workers (and of this process) remain
    assert total - free < 6 * GIB, ((total - free) / GIB)
