"""The float64 judgment of rounding-sized failures (`harness.worker.rounding`), on CPU tensors: the
real comparison and the real float64 copy of a model whose float32 sum rounds more than the
tolerance allows."""

from __future__ import annotations

from test_precision_probes import _arbitration_case, _tf32_case

from kb_mcp.harness.judgment.probing import PROBE_BOUND
from kb_mcp.harness.worker.rounding import RoundingJudge
from kb_mcp.harness.worker.values import compare


def test_a_more_exact_output_passes_and_the_judgment_says_why() -> None:
    model, x, strict, exact = _arbitration_case()
    judge = RoundingJudge(model)
    comps = [compare(exact, strict, 1e-4, 1e-4)]
    assert judge.applies(comps, [strict])
    judged = judge.judge(comps[0].message, [exact], [strict], lambda: [x])
    assert judged.passed and judged.ratio is not None and judged.ratio <= 1.0, judged
    assert "judged against float64 instead" in judged.message and comps[0].message in judged.message
    assert not judge.failed


def test_plain_tf32_fails_and_later_outputs_are_not_judged_again() -> None:
    model, a, strict, plain_tf32 = _tf32_case()
    comps = [compare(plain_tf32, strict, 1e-4, 1e-4)]
    judge = RoundingJudge(model)
    assert judge.applies(comps, [strict])  # small errors everywhere: rounding-sized, so judged
    first = judge.judge(comps[0].message, [plain_tf32], [strict], lambda: [a])
    assert not first.passed and first.ratio is not None and first.ratio > PROBE_BOUND, first
    assert judge.failed and "against float64" in first.message
    asked: list[bool] = []
    later = judge.judge("again", [strict], [strict], lambda: asked.append(True) or [a])
    assert not later.passed and later.ratio is None and "earlier output failed" in later.message
    assert asked == []  # no inputs made again, no float64 run


def test_outputs_without_inputs_or_beyond_rounding_are_not_passed() -> None:
    model, _, strict, exact = _arbitration_case()
    judge = RoundingJudge(model)
    lost = judge.judge("lost", [exact], [strict], lambda: None)
    assert not lost.passed and "inputs were not kept" in lost.message
    wrong = strict + strict.abs().max()  # far beyond rounding: not for the judge at all
    assert not RoundingJudge(model).applies([compare(wrong, strict, 1e-4, 1e-4)], [strict])
    assert not RoundingJudge(model).applies([compare(strict, strict, 1e-4, 1e-4)], [strict])  # nothing failed
