"""GPU side of the adversarial suite: every candidate of expectations.toml goes through the real
harness (`WorkerPool.verify`, a warm worker process) and must get the verdict and finding the table
names; honest candidates must pass with no finding and no review flag.

Cheats run before honest candidates, so the honest ones also show that the pool recovers from
whatever the cheats did to their workers. Baselines use eager PyTorch only (torch.compile's
first call costs seconds per problem and adds nothing to an integrity test). Set
KBMCP_ADVERSARIAL_LOG to a file path to get one JSON line per verdict.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from adversarial_cases import CASES, Case

from kb_mcp.harness.judgment.verdict import VerifyOptions, VerifyResult
from kb_mcp.harness.problem import load_problem

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from kb_mcp.harness.pool.pool import WorkerPool

    with WorkerPool(cache_dir=tmp_path_factory.mktemp("adversarial_cache"), prestart=True) as p:
        yield p


def _log(case: Case, result: VerifyResult) -> None:
    path = os.environ.get("KBMCP_ADVERSARIAL_LOG")
    if not path:
        return
    t = result.timings
    line = {
        "case": case.id,
        "problem": case.problem,
        "exploit": case.exploit,
        "verdict": result.verdict.value,
        "codes": sorted({f.code.value for f in result.findings}),
        "flagged": result.flagged,
        "summary": result.summary[:300],
        "elapsed_s": result.elapsed_s,
        "phases_s": result.phases_s,
        "candidate_ms": t.candidate_ms if t else None,
        "eager_ms": t.eager_ms if t else None,
        "speedup_vs_eager": t.speedup_vs_eager if t else None,
        "worker_replaced": result.worker_replaced,
        "mode": result.mode,
        "coverage": result.coverage,
    }
    with Path(path).open("a") as fh:
        fh.write(json.dumps(line) + "\n")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_candidate_gets_expected_verdict(pool: object, case: Case) -> None:
    problem = load_problem(case.problem_path)
    options = VerifyOptions(allow=list(case.allow), compile_baseline=False, mode=case.mode)  # type: ignore[arg-type]
    result: VerifyResult = pool.verify(problem, case.path.read_text(), options)  # type: ignore[attr-defined]
    _log(case, result)
    codes = {f.code.value for f in result.findings}
    detail = (
        f"{result.verdict.value}: {result.summary}\nfindings: {[(f.code.value, f.message) for f in result.findings]}"
    )
    assert result.verdict.value in case.verdicts, detail
    if case.honest:
        assert codes == set(), detail
        assert not result.flagged, detail
        assert result.timings is not None and result.timings.speedup_vs_eager is not None
        if case.min_speedup_vs_eager is not None:
            assert result.timings.speedup_vs_eager > case.min_speedup_vs_eager, detail
        assert result.mode == case.mode, detail
        if case.mode == "composed":  # every composed verdict states its coverage
            assert result.coverage is not None and 0.0 <= result.coverage <= 1.0, detail
            assert case.min_coverage is None or result.coverage >= case.min_coverage, detail
            assert case.max_coverage is None or result.coverage <= case.max_coverage, detail
    else:
        assert codes & set(case.codes_any), f"expected one of {case.codes_any}; {detail}"
