"""Escalation on a real GPU (`harness.worker.evidence`): an exact rewrite counts, fakes do not.

examples/problems/linear_sum.py sums a linear layer's outputs; its exact rewrite
(examples/candidates/linear_sum_rewrite_nvrtc.py: x . colsum(W) + sum(b), parameters renamed)
runs far below the reference's roofline. It must come out `faster`, not held, with the evidence
in its summary; the fakes beside it (tests/adversarial/cheats/linear_sum_*) must not.

The numbers behind the thresholds (H100 SXM, strict FP32): eager's GEMM is 2.7e11 FLOPs, ~6 ms;
the rewrite reads W (64 MiB) and x (128 MiB), ~0.06 ms, and its call from Python costs ~0.1-0.45 ms
of host time (three launches, three allocations, in the sandboxed worker): ~15x over eager.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kb_mcp.harness.judgment.verdict import FindingCode, VerifyOptions
from kb_mcp.harness.plausibility import impossible_time, work_bound
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import Problem, load_problem
from kb_mcp.harness.worker.evidence import device_peaks
from kb_mcp.kb.models import Verdict
from kb_mcp.profiling.work import take_work_census

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
CHEATS = ROOT / "tests" / "adversarial" / "cheats"
# Escalate at any speedup above 4x (the rewrite is ~15x over eager, see above); eager alone as the
# baseline, since torch.compile's first compile costs seconds and adds nothing here.
ESCALATE = VerifyOptions(implausible_speedup=4.0, compile_baseline=False)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerPool]:
    with WorkerPool(tmp_path_factory.mktemp("evidence-cache"), prestart=True) as p:
        yield p


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(ROOT / "examples" / "problems" / "linear_sum.py")


def _detail(result) -> str:
    return f"{result.verdict.value}: {result.summary}\nfindings: {[(f.code.value, f.message) for f in result.findings]}"


def test_the_exact_rewrite_counts_with_its_evidence(pool: WorkerPool, problem: Problem) -> None:
    source = (ROOT / "examples" / "candidates" / "linear_sum_rewrite_nvrtc.py").read_text()
    result = pool.verify(problem, source, ESCALATE)
    assert result.verdict == Verdict.faster and not result.flagged and result.findings == [], _detail(result)
    t = result.timings
    # Below the threshold nothing escalates (at a batch of 1024 the host-bound rewrite measured only
    # 2.0x on an H100): say so before asking for the evidence.
    speedup = None if t is None else t.speedup_vs_baseline
    assert t is not None and speedup is not None and speedup > ESCALATE.implausible_speedup, _detail(result)
    assert t.evidence, _detail(result)
    assert t.work_bound_ms is not None and 0 < t.work_bound_ms <= t.candidate_ms, t
    # Its kernels read W (64 MiB) and x (128 MiB) at least once; the bound counts x's kernel beyond
    # one L2 (50 MiB): 142 MiB, ~44 us at 3.35 TB/s. Half of that at a faster HBM: not a trivial bound.
    assert t.work_bound_ms > 0.5 * (142 << 20) / 3.9e12 * 1e3, t
    assert "evidence:" in result.summary and "its own work takes at least" in result.summary
    # Renamed parameters (w, b for linear.weight, linear.bias) are matched by value and perturbed.
    perturbed = [s for s in result.input_sets if s.kind == "perturbed"]
    assert len(perturbed) == 3 and all(s.passed and not s.skipped for s in perturbed), perturbed
    shaped = [s for s in result.input_sets if s.kind == "second_shape"]
    assert shaped and all(s.passed and not s.skipped for s in shaped), shaped
    assert sum(1 for s in result.input_sets if s.kind == "secret") >= 5 + 8


def test_the_rewrite_counts_under_the_default_threshold(pool: WorkerPool, problem: Problem) -> None:
    source = (ROOT / "examples" / "candidates" / "linear_sum_rewrite_nvrtc.py").read_text() + "\n# default options\n"
    result = pool.verify(problem, source, VerifyOptions(compile_baseline=False))
    assert result.verdict == Verdict.faster and not result.flagged and result.findings == [], _detail(result)
    assert not any(f.code == FindingCode.implausible_speedup for f in result.findings)


def test_a_cached_output_is_caught(pool: WorkerPool, problem: Problem) -> None:
    result = pool.verify(problem, (CHEATS / "linear_sum_pointer_cache.py").read_text(), ESCALATE)
    codes = {f.code for f in result.findings}
    assert result.verdict in (Verdict.invalid, Verdict.incorrect), _detail(result)
    assert codes & {FindingCode.result_caching, FindingCode.timed_output_mismatch, FindingCode.stateful_forward}


def test_a_slow_kernel_hidden_from_the_events_is_caught(pool: WorkerPool, problem: Problem) -> None:
    # Tens of ms of its own GEMM on a side stream; the events see its issue time (a fake ~15x+).
    result = pool.verify(problem, (CHEATS / "linear_sum_hidden_stream.py").read_text(), ESCALATE)
    codes = {f.code for f in result.findings}
    assert result.verdict == Verdict.invalid, _detail(result)
    assert codes & {FindingCode.impossible_time, FindingCode.unsynchronized_work}, _detail(result)
    # A real fake: the events missed most of each call (the host clock waited for the side stream).
    for f in result.findings:
        m = re.search(r"host clock \(median ([\d.]+) ms.*?current stream \(median ([\d.]+) ms", f.message)
        if f.code == FindingCode.unsynchronized_work and m:
            assert float(m[1]) > 4 * float(m[2]), f.message


def test_the_hidden_kernels_own_work_rules_out_the_time_the_events_saw(pool: WorkerPool, problem: Problem) -> None:
    # The second line behind the host-clock check above: were that check absent, the fake speedup
    # escalates and the work census of the same forward makes its time impossible. Its GEMM alone
    # is 8192 * 4096 * 4096 / 32 = 4.3e9 warp FFMAs: >= 4 ms at an H100's issue rate (132 SMs x 4
    # per cycle at 1.98 GHz), while the events around its call measured well under 1 ms.
    census = take_work_census(problem, (CHEATS / "linear_sum_hidden_stream.py").read_text(),
                              cache_dir=pool.cache_dir, sandbox=pool.sandbox)
    assert census.available and census.kernels, census.note
    bound = work_bound(census, device_peaks(torch.cuda.get_device_properties(0)))
    assert bound is not None and bound.ms > 3.0, bound
    found = impossible_time(1.0, bound)
    assert found is not None and found.code == FindingCode.impossible_time, bound


def test_renamed_parameters_are_still_perturbed(pool: WorkerPool, problem: Problem) -> None:
    result = pool.verify(problem, (CHEATS / "linear_sum_stale_sums.py").read_text(), ESCALATE)
    assert result.verdict == Verdict.invalid, _detail(result)
    assert FindingCode.ignores_inputs in {f.code for f in result.findings}, _detail(result)
