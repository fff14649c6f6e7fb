"""CPU side of the adversarial suite: the table is complete and consistent, every cheat says what
it exploits, and the static checks report exactly the codes the table expects (no more: an
honest candidate must not be rejected for a harmless construct)."""

from __future__ import annotations

import ast

import pytest
from adversarial_cases import CASES, CHEATS, HERE, HONEST, Case

from kb_mcp.harness.judgment.integrity_static import check_source
from kb_mcp.harness.judgment.verdict import REVIEW_ONLY, FindingCode
from kb_mcp.harness.problem import load_problem
from kb_mcp.kb.models import Verdict

# The exploit classes of DESIGN.md section 5, each of which needs at least one cheat here.
EXPLOITS = (
    "reusing the reference's freed output memory",
    "reading uninitialised memory that happens to match",
    "constant or zero output",
    "shortcuts that only fit the test distribution",
    "ignoring some inputs or weights",
    "writing into the inputs",
    "calling PyTorch/cuBLAS instead of its own kernel",
    "a try/except fallback to the reference",
    "caching results keyed on pointer/shape/content",
    "doing all calls' work in the first call",
    "predicting test inputs from a known seed",
    "work on a side stream that the timer misses",
    "work on a background thread that the timer misses",
    "lazy tensor subclasses",
    "monkey-patching timers",
    "monkey-patching synchronize",
    "monkey-patching allclose",
    "forging the result channel",
    "silently lowering precision",
    "L2 persistence surviving the flush",
    "correct once, then wrong inside the timed loop",
    "state carried across calls",
    "composed mode: a fused attention path the reference never takes",
    "composed mode: a PyTorch op the reference never runs",
    "composed mode: cuDNN's benchmark mode",
    "composed mode: a TF32 switch",
    "composed mode: torch.compile",
    "composed mode: CUDA graph replay",
)


def test_every_exploit_class_has_a_cheat() -> None:
    tried = {c.exploit for c in CHEATS}
    missing = [e for e in EXPLOITS if not any(t.startswith(e) for t in tried)]
    assert missing == []


def test_every_cheat_code_is_a_finding_code_and_all_codes_are_exercised() -> None:
    codes = {code for c in CHEATS for code in (*c.codes_any, *c.static)}
    assert codes <= {f.value for f in FindingCode}
    untested = {f.value for f in FindingCode} - codes - {f.value for f in REVIEW_ONLY}
    assert untested == set()


def test_table_and_folders_agree() -> None:
    listed = {c.path for c in CASES}
    on_disk = set((HERE / "cheats").glob("*.py")) | set((HERE / "honest").glob("*.py"))
    assert on_disk - listed == set(), "every candidate file needs a row in expectations.toml"
    assert all(c.path.is_file() for c in CASES)
    assert len({c.id for c in CASES}) == len(CASES)
    assert len(HONEST) >= 5 and len(CHEATS) >= 22
    # The honest fused kernel on a tiny problem, legitimately > 10x faster than eager.
    assert any(c.min_speedup_vs_eager is not None and c.min_speedup_vs_eager >= 10 and "faster" in c.verdicts
               for c in HONEST)
    assert all(c.min_speedup_vs_eager is None for c in CHEATS) and all(not c.extra for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case_is_well_formed(case: Case) -> None:
    load_problem(case.problem_path)  # the problem exists and is a KernelBench problem
    assert case.verdicts and all(v in {x.value for x in Verdict} for v in case.verdicts)
    doc = ast.get_docstring(ast.parse(case.path.read_text())) or ""
    assert case.mode in ("own", "composed")
    assert case.mode == "composed" or (case.min_coverage is None and case.max_coverage is None)
    if case.honest:
        assert set(case.verdicts) <= {"faster", "slower"} and not case.codes_any
    else:
        assert doc.startswith("Exploit:") and "Caught by:" in doc, "a cheat says what it exploits and what catches it"
        assert case.codes_any, "a cheat names the finding(s) that must catch it"
        assert not set(case.verdicts) & {"faster", "slower"}, "a cheat must never pass"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_static_findings_match_the_table(case: Case) -> None:
    found = check_source(case.path.read_text(), case.allow, composed=case.mode == "composed")
    assert sorted({f.code.value for f in found}) == sorted(set(case.static)), [
        (f.code.value, f.line, f.message) for f in found
    ]
    for f in found:
        assert f.source == "static" and f.line is not None and f.message.startswith(f"line {f.line}:")
