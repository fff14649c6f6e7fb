"""Device time on a real GPU: measured under the profiler (in this process, and in the census worker
for a verdict), reported beside the end-to-end times, cached with the baseline."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from kb_mcp.harness.baselines import BaselineCache
from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import load_problem
from kb_mcp.harness.worker.profiling import DEVICE_RUNS, measure_device_time
from kb_mcp.harness.worker.timing import L2Flusher
from kb_mcp.kb.models import Verdict

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OPTIONS = VerifyOptions(compile_baseline=False)


def test_one_kernel_has_a_device_time_far_below_what_the_host_sees() -> None:
    x = torch.zeros(8192, device="cuda")
    flush = L2Flusher(int(torch.cuda.get_device_properties(0).L2_cache_size))
    x.add_(1.0)
    # A process pays CUPTI's start-up at its first profiler session (seconds); the census worker
    # pays it when it starts, so the budget applies to the sessions after the first.
    measure_device_time(lambda: x.add_(1.0), flush)
    t0 = time.perf_counter()
    got = measure_device_time(lambda: x.add_(1.0), flush)
    spent = time.perf_counter() - t0
    assert got.ms is not None and 0 < got.ms < 0.02, got  # a few microseconds
    assert (got.kernels, got.runs) == (1, DEVICE_RUNS)
    assert spent < 1.0  # the budget of the extra profiled runs


def test_a_verified_candidate_has_device_times_beside_its_end_to_end_ones(tmp_path: Path) -> None:
    problem = load_problem(EXAMPLES / "problems" / "elementwise_chain_small.py")
    source = (EXAMPLES / "candidates" / "elementwise_chain_small_nvrtc.py").read_text()
    with WorkerPool(tmp_path) as pool:
        first = pool.verify(problem, source, OPTIONS)
        assert first.verdict in (Verdict.faster, Verdict.slower), first.summary
        t = first.timings
        assert t is not None and t.candidate_device_ms is not None and t.eager_device_ms is not None, t
        assert t.candidate_device_ms > 0 and t.eager_device_ms > 0 and t.candidate_kernels == 1
        # one small kernel: its device time is far below the launch-bound end-to-end time
        assert t.candidate_device_ms < 0.5 * t.candidate_ms, t
        assert t.eager_device_ms < t.eager_ms and t.speedup_device_vs_eager is not None
        assert "; device " in first.summary
        info = pool.info()
        cache = BaselineCache(tmp_path)
        cached = cache.get(problem.hash, info.device, info.torch_version, need_compile=False)
        assert cached is not None and cached.eager_device_ms == t.eager_device_ms

        # A baseline cached before device time existed gets eager's from the census worker.
        path = cache.path(problem.hash, info.device, info.torch_version)
        data = json.loads(path.read_text())
        del data["eager_device_ms"]
        path.write_text(json.dumps(data))
        again = pool.verify(problem, source, OPTIONS)
        assert again.timings is not None and again.timings.baseline_cached
        assert again.timings.eager_device_ms is not None and again.timings.eager_device_ms > 0
        refreshed = cache.get(problem.hash, info.device, info.torch_version, need_compile=False)
        assert refreshed is not None and refreshed.eager_device_ms == again.timings.eager_device_ms
        state = pool.state()
        assert state["verify"].profiler_sessions == 0 and state["census"].profiler_sessions > 0
