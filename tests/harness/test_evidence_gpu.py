"""Escalation on a real GPU (`harness.worker.evidence`): an exact rewrite counts, fakes do not.

examples/problems/linear_sum.py sums a linear layer's outputs; its exact rewrite
(examples/candidates/linear_sum_rewrite_nvrtc.py: x . colsum(W) + sum(b), parameters renamed)
runs far below the reference's roofline. It must come out `faster`, not held, with the evidence
in its summary; the fakes beside it (tests/adversarial/cheats/linear_sum_*) must not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kb_mcp.harness.pool import WorkerPool
from kb_mcp.harness.problem import Problem, load_problem
from kb_mcp.harness.verdict import FindingCode, VerifyOptions
from kb_mcp.kb.models import Verdict

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
CHEATS = ROOT / "tests" / "adversarial" / "cheats"
# Escalate at any speedup above 4x (the rewrite is ~10-20x over eager); eager alone as the baseline,
# since torch.compile's first compile costs seconds and adds nothing here.
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
    assert t is not None and t.evidence, _detail(result)
    assert t.work_bound_ms is not None and 0 < t.work_bound_ms <= t.candidate_ms, t
    # Its kernels read W (64 MiB) and x (16 MiB) at least once: the bound is not a trivial one.
    assert t.work_bound_ms > 0.5 * (80 << 20) / 3.9e12 * 1e3, t
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


def test_work_timed_out_of_the_events_is_impossible(pool: WorkerPool, problem: Problem) -> None:
    result = pool.verify(problem, (CHEATS / "linear_sum_hidden_stream.py").read_text(), ESCALATE)
    codes = {f.code for f in result.findings}
    assert result.verdict == Verdict.invalid, _detail(result)
    assert codes & {FindingCode.impossible_time, FindingCode.unsynchronized_work}, _detail(result)


def test_renamed_parameters_are_still_perturbed(pool: WorkerPool, problem: Problem) -> None:
    result = pool.verify(problem, (CHEATS / "linear_sum_stale_sums.py").read_text(), ESCALATE)
    assert result.verdict == Verdict.invalid, _detail(result)
    assert FindingCode.ignores_inputs in {f.code for f in result.findings}, _detail(result)
