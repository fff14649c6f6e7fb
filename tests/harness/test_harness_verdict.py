"""The verdict model: options validation, decision order, plausibility flags, the KB record."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from kb_mcp.harness.judgment import options as options_module
from kb_mcp.harness.judgment import verdict as verdict_module
from kb_mcp.harness.judgment.options import assess_options
from kb_mcp.harness.judgment.verdict import (
    CompileResult,
    CompileUnit,
    Evidence,
    Failure,
    FailureKind,
    Finding,
    FindingCode,
    InputSetCheck,
    Timings,
    VerifyOptions,
    VerifyResult,
    decide,
    judge,
)
from kb_mcp.harness.plausibility import plausibility_findings
from kb_mcp.harness.protocol import CensusReply
from kb_mcp.kb.models import Strength, Verdict

OK = CompileResult(ok=True, style="nvrtc", arch="sm_90")
GOOD_SETS = [InputSetCheck(index=i, kind="secret", passed=True, numel=10) for i in range(6)]


def timings(cand: float, eager: float, compile_ms: float | None = None, bound: float | None = None) -> Timings:
    best = min(x for x in (eager, compile_ms) if x is not None)
    return Timings(candidate_ms=cand, candidate_min_ms=cand, candidate_host_ms=cand, runs=20, eager_ms=eager,
                   compile_ms=compile_ms, speedup_vs_eager=eager / cand, speedup_vs_baseline=best / cand,
                   bound_ms=bound)


def test_options_reject_weak_or_unknown_settings() -> None:
    with pytest.raises(ValidationError):
        VerifyOptions(input_sets=3)  # fewer than five secret sets is not allowed
    with pytest.raises(ValidationError):
        VerifyOptions(atol=-1.0)
    with pytest.raises(ValidationError):
        VerifyOptions(implausible_speedup=1.0)
    with pytest.raises(ValidationError):
        VerifyOptions.model_validate({"tolerance": 0.1})  # unknown field, not silently ignored
    opts = VerifyOptions.model_validate({"seeds": [1, 2], "allow": ["gemm"], "timing": False})
    assert opts.input_sets == 5 and opts.seeds == [1, 2] and not opts.timing


def test_compile_error_wins_over_everything() -> None:
    bad = CompileResult(ok=False, messages=["k.cu(3): error: x is undefined"])
    cheat = [Finding(code=FindingCode.library_call, message="calls torch.matmul")]
    verdict, flagged, summary = decide(bad, [], cheat, None)
    assert verdict == Verdict.compile_error and "x is undefined" in summary and not flagged


def test_cheat_findings_make_it_invalid_even_when_sets_pass() -> None:
    f = [Finding(code=FindingCode.unsynchronized_work, message="side stream")]
    verdict, _, summary = decide(OK, GOOD_SETS, f, timings(0.1, 1.0))
    assert verdict == Verdict.invalid and "unsynchronized_work" in summary


def test_wrong_answers_are_incorrect_and_name_the_first_failing_set() -> None:
    sets = GOOD_SETS[:3] + [InputSetCheck(index=3, kind="shifted", passed=False, mismatched=4, numel=10,
                                          message="4 of 10 off")]
    verdict, _, summary = decide(OK, sets, [], None)
    assert verdict == Verdict.incorrect and "set 3 (shifted)" in summary and "1 of 4" in summary
    lowered = [Finding(code=FindingCode.precision_lowered, message="bf16-like errors")]
    verdict, _, summary = decide(OK, GOOD_SETS, lowered, None)
    assert verdict == Verdict.incorrect and "bf16" in summary


def test_a_lowered_precision_explains_a_shifted_only_failure_but_not_other_cheats() -> None:
    sets = GOOD_SETS[:5] + [InputSetCheck(index=5, kind="shifted", passed=False, mismatched=3, numel=10,
                                          message="3 of 10 off")]
    shortcut = Finding(code=FindingCode.distribution_shortcut, message="wrong only on the shifted inputs")
    lowered = Finding(code=FindingCode.precision_lowered, message="computes in bf16 (HMMA.BF16 in its SASS)",
                      source="static")
    # alone, a shifted-only failure is a cheat on the distribution
    assert decide(OK, sets, [shortcut], None)[0] == Verdict.invalid
    # beside a lowered precision it is that precision's error: a wrong answer, named as such
    verdict, _, summary = decide(OK, sets, [shortcut, lowered], None)
    assert verdict == Verdict.incorrect and "precision_lowered" in summary and "set 5 (shifted)" in summary
    # any other cheat still makes it invalid
    side = Finding(code=FindingCode.unsynchronized_work, message="side stream")
    verdict, _, summary = decide(OK, sets, [shortcut, lowered, side], None)
    assert verdict == Verdict.invalid and "unsynchronized_work" in summary


def test_speedup_decides_faster_or_slower_against_the_better_baseline() -> None:
    assert decide(OK, GOOD_SETS, [], timings(0.5, 1.0, 0.4))[0] == Verdict.slower  # compile beats it
    verdict, flagged, summary = decide(OK, GOOD_SETS, [], timings(0.2, 1.0, 0.4))
    assert verdict == Verdict.faster and not flagged and "torch.compile" in summary and "2.00x" in summary
    with pytest.raises(ValueError):
        decide(OK, GOOD_SETS, [], None)  # a verified candidate without timings is a harness bug


def test_sets_judged_against_float64_pass_and_the_summary_says_so() -> None:
    judged = InputSetCheck(index=6, kind="shifted", passed=True, numel=10, mismatched=3, float64_ratio=0.21)
    verdict, flagged, summary = decide(OK, [*GOOD_SETS, judged], [], timings(0.5, 1.0))
    assert verdict == Verdict.faster and not flagged
    assert "1 of them outside the float32 tolerance by the reference's own rounding" in summary, summary
    assert "worst 0.21x" in summary
    # a set that failed its arbitration stays a failure, whatever ratio it carries
    failed = judged.model_copy(update={"passed": False, "float64_ratio": 150.0})
    assert decide(OK, [*GOOD_SETS, failed], [], timings(0.5, 1.0))[0] == Verdict.incorrect


def test_without_gpu_a_clean_build_needs_gpu() -> None:
    verdict, flagged, summary = decide(OK.model_copy(update={"units": []}), [], [], None, gpu=False)
    assert verdict == Verdict.needs_gpu and not flagged and "need a GPU" in summary


def test_implausible_speedups_and_loosened_tolerances_flag_without_passing_silently() -> None:
    t = timings(0.001, 1.0)
    found = plausibility_findings(t, factor=50)
    assert [f.code for f in found] == [FindingCode.implausible_speedup]
    verdict, flagged, summary = decide(OK, GOOD_SETS, found, t)
    assert verdict == Verdict.faster and flagged and "flagged" in summary
    below_roofline = plausibility_findings(timings(0.05, 0.2, bound=0.1), factor=50)
    assert len(below_roofline) == 1 and "roofline" in below_roofline[0].message
    assert plausibility_findings(timings(0.12, 0.2, bound=0.1), factor=50) == []
    _, flagged, summary = decide(OK, GOOD_SETS, [], timings(0.5, 1.0), loosened="tolerance loosened")
    assert flagged and "tolerance loosened" in summary


def test_record_carries_the_servers_numbers() -> None:
    t = timings(0.5, 1.0, 0.8)
    result = VerifyResult(candidate_id="c_1", problem="p", problem_hash="h", verdict=Verdict.faster, summary="s",
                          compile=OK, timings=t, device="NVIDIA H100", arch="sm_90",
                          findings=[Finding(code=FindingCode.implausible_speedup, message="m")], flagged=True)
    rec = result.record(VerifyOptions())
    assert (rec.candidate_id, rec.verdict, rec.time_ms, rec.eager_ms,
            rec.compile_ms) == ("c_1", Verdict.faster, 0.5, 1.0, 0.8)
    assert rec.speedup_vs_baseline == pytest.approx(1.6) and rec.flagged and rec.findings == ["implausible_speedup"]
    assert rec.arch == "sm_90"
    cpu = result.model_copy(update={"device": "", "timings": None,
                                    "verdict": Verdict.needs_gpu}).record(VerifyOptions())
    assert cpu.arch == "" and cpu.time_ms is None


# ---- what the caller's options let a verdict claim ------------------------------------------


def test_every_option_is_classified() -> None:
    # A new option must be decided here, not fall through to the conservative default unnoticed.
    assert set(VerifyOptions.model_fields) == set(options_module._EFFECTS)


@pytest.mark.parametrize(
    ("options", "gpu", "strength", "kept"),
    [
        ({}, True, Strength.standard, {}),
        ({}, False, Strength.compile_only, {}),
        ({"compile_only": True}, False, Strength.compile_only, {}),
        ({"max_output_chars": 100}, True, Strength.standard, {}),
        ({"timed_runs": 200}, True, Strength.standard, {"timed_runs": 200}),
        ({"timing": False}, True, Strength.quick, {"timing": False}),
        ({"timed_runs": 5}, True, Strength.quick, {"timed_runs": 5}),
        ({"compile_baseline": False}, True, Strength.quick, {"compile_baseline": False}),
        ({"timeout_s": 0.01}, True, Strength.custom, {"timeout_s": 0.01}),
        ({"arch": "sm_10"}, False, Strength.custom, {"arch": "sm_10"}),
        ({"arch": "sm_10"}, True, Strength.standard, {}),  # a GPU run builds for its own GPU
        ({"seeds": [1, 2]}, True, Strength.custom, {"seeds": [1, 2]}),
        ({"input_sets": 8}, True, Strength.custom, {"input_sets": 8}),
        ({"implausible_speedup": 10.0}, True, Strength.custom, {"implausible_speedup": 10.0}),
        ({"atol": 1e-9}, True, Strength.custom, {"atol": 1e-9}),
        ({"allow": ["gemm"]}, True, Strength.loosened, {"allow": ["gemm"]}),
        ({"implausible_speedup": 1000.0}, True, Strength.loosened, {"implausible_speedup": 1000.0}),
        ({"timeout_s": 500.0}, True, Strength.loosened, {"timeout_s": 500.0}),
        ({"compile_timeout_s": 900.0, "timing": False}, False, Strength.loosened, {"compile_timeout_s": 900.0,
                                                                                   "timing": False}),
    ],
)
def test_options_decide_the_strength_and_the_key(options, gpu, strength, kept) -> None:
    got = assess_options(VerifyOptions(**options), gpu=gpu)
    assert got.strength == strength and got.options == kept
    assert bool(got.loosened) == (strength == Strength.loosened)


def test_only_the_worker_can_tell_a_loosened_tolerance() -> None:
    tightened = assess_options(VerifyOptions(atol=0.5), gpu=True)
    loosened = assess_options(VerifyOptions(atol=0.5), gpu=True, tolerance_loosened="tolerance loosened to atol=0.5")
    assert tightened.strength == Strength.custom and loosened.strength == Strength.loosened
    assert loosened.loosened == ["tolerance loosened to atol=0.5"]


def test_records_of_other_options_have_other_keys_and_a_loosened_one_is_flagged() -> None:
    result = VerifyResult(candidate_id="c_1", problem="p", problem_hash="h", verdict=Verdict.faster, summary="s",
                          compile=OK, timings=timings(0.5, 1.0), device="NVIDIA H100", arch="sm_90")
    standard = result.record(VerifyOptions())
    weak = result.record(VerifyOptions(timeout_s=0.01))
    loose = result.record(VerifyOptions(allow=["gemm"]))
    assert len({standard.key, weak.key, loose.key}) == 3
    assert all(r.key.startswith("c_1/v_") for r in (standard, weak, loose))
    assert standard.creditable and not weak.creditable and not loose.creditable
    assert loose.flagged and loose.loosened and not standard.flagged
    assert result.record(VerifyOptions(max_output_chars=10)).key == standard.key  # output size is not a condition
    elsewhere = result.model_copy(update={"device": "NVIDIA A100", "arch": "sm_80"}).record(VerifyOptions())
    assert elsewhere.key != standard.key  # another GPU's measurement does not replace this one
    assert sorted([weak, loose, standard], key=lambda r: r.order)[-1] is standard


# -- every ending is a typed Failure, worded by judge alone -------------------------------------------

_CENSUS = "the census worker runs one forward under the profiler, in a process of its own"
_FORGED = Finding(code=FindingCode.forged_result,
                  message="the result channel carried data the harness did not send (bad MAC); writing to the "
                          "worker's channel or faking its messages is not allowed")
# kind -> (the failure's fields, extra evidence, the verdict and the summary the harness gave before
# the endings became typed: wordings callers and tests read).
ENDINGS: dict[FailureKind, tuple[dict[str, object], dict[str, object], Verdict, str]] = {
    FailureKind.malformed: ({"detail": "c.py: the candidate source is empty"}, {}, Verdict.compile_error,
                            "compile error: c.py: the candidate source is empty"),
    FailureKind.build_failed: ({}, {"compile": CompileResult(ok=False, messages=["k.cu(3): error"])},
                               Verdict.compile_error, "compile error: k.cu(3): error"),
    FailureKind.syntax_error: ({"detail": "Python syntax error at line 2: invalid syntax"}, {},
                               Verdict.compile_error, "compile error: Python syntax error at line 2: invalid syntax"),
    FailureKind.no_model: ({"detail": "the candidate defines no class ModelNew"}, {}, Verdict.compile_error,
                           "compile error: the candidate defines no class ModelNew"),
    FailureKind.out_of_memory: ({"where": "ModelNew.forward", "detail": "CUDA out of memory"}, {}, Verdict.crashed,
                                "crashed: ModelNew.forward ran out of GPU memory: CUDA out of memory"),
    FailureKind.cuda_error: ({"where": "ModelNew.forward", "detail": "illegal address"}, {}, Verdict.crashed,
                             "crashed: ModelNew.forward raised a CUDA error (the CUDA context survived): illegal "
                             "address"),
    FailureKind.exited: ({"where": "constructing ModelNew", "detail": "SystemExit"}, {}, Verdict.crashed,
                         "crashed: constructing ModelNew tried to exit the worker (SystemExit)"),
    FailureKind.raised: ({"where": "importing the candidate", "detail": "ValueError: no"}, {}, Verdict.crashed,
                         "crashed: importing the candidate raised ValueError: no"),
    FailureKind.problem_output: ({"detail": "the problem's Model returned a list"}, {}, Verdict.crashed,
                                 "crashed: the problem's Model returned a list"),
    FailureKind.problem_failed: ({"detail": "ImportError: x"}, {}, Verdict.crashed,
                                 "the problem failed: ImportError: x"),
    FailureKind.timed_out: ({"where": "running ModelNew.forward on the input sets", "limit_s": 120.0}, {},
                            Verdict.timeout, "timeout: no answer within 120 s while running ModelNew.forward on the "
                                             "input sets; the worker was killed and replaced"),
    FailureKind.worker_died: ({"where": "constructing ModelNew", "detail": "killed by SIGSEGV"}, {}, Verdict.crashed,
                              "crashed: the worker died (killed by SIGSEGV) while constructing ModelNew; it was "
                              "replaced"),
    FailureKind.forged_frame: ({}, {"findings": [_FORGED]}, Verdict.invalid,
                               f"invalid (forged_result): {_FORGED.message}"),
    FailureKind.internal_error: ({"detail": "KeyError: 'x'"}, {}, Verdict.crashed,
                                 "crashed: internal harness error (KeyError: 'x'); the worker was replaced"),
    FailureKind.census_raised: ({"where": "ModelNew.forward", "detail": "RuntimeError: boom"}, {}, Verdict.crashed,
                                "crashed: ModelNew.forward raised RuntimeError: boom in the census worker (where one "
                                "forward runs under the profiler, in a process of its own), although it passed the "
                                "checks"),
    FailureKind.census_context_broken: ({}, {}, Verdict.crashed,
                                        "crashed: the CUDA context of the census worker broke during the census"),
    FailureKind.census_timed_out: ({"where": "running forward for the kernel census", "limit_s": 3.0}, {},
                                   Verdict.timeout, "timeout: no answer within 3 s while running forward for the "
                                                    f"kernel census ({_CENSUS}); it was killed and replaced"),
    FailureKind.census_died: ({"where": "constructing ModelNew for the kernel census", "detail": "killed by SIGABRT"},
                              {}, Verdict.crashed, "crashed: the census worker died (killed by SIGABRT) while "
                                                   f"constructing ModelNew for the kernel census ({_CENSUS}); it was "
                                                   "replaced"),
    FailureKind.census_problem_failed: ({"detail": "ImportError: x"}, {}, Verdict.crashed,
                                        "crashed: the problem failed: ImportError: x"),
    FailureKind.census_problem_diverged: ({"detail": "ImportError: x"}, {}, Verdict.crashed,
                                          "crashed: the problem failed in the census worker (ImportError: x)"),
    FailureKind.census_internal_error: ({"detail": "KeyError: 'x'"}, {}, Verdict.crashed,
                                        "crashed: internal error of the census worker (KeyError: 'x'); it was "
                                        "replaced"),
    # Kinds that came with issue 24 (their numbers are worded from `Failure.memory`: test_fault_cpu).
    FailureKind.memory_hoarded: ({"where": "ModelNew.forward (timed run 2)", "detail": "CUDA out of memory"}, {},
                                 Verdict.crashed, "crashed: ModelNew holds GPU memory beyond its share after "
                                                  "ModelNew.forward (timed run 2), so the harness could not allocate "
                                                  "what it needed: CUDA out of memory"),
    FailureKind.harness_out_of_memory: ({"where": "timing", "detail": "CUDA out of memory"}, {}, Verdict.crashed,
                                        "not judged: the GPU ran out of memory while timing (CUDA out of memory): the "
                                        "machine's limit, not the candidate's fault, and nothing was stored"),
    FailureKind.shifted_inputs_rejected: ({"where": "inputs with every input negated", "detail": "CUDA error: "
                                                                                                 "device-side assert "
                                                                                                 "triggered"}, {},
                                          Verdict.crashed, "not judged: the problem's Model raised a CUDA error on "
                                          "the harness's different-distribution inputs (inputs with every input "
                                          "negated): CUDA error: device-side assert triggered. Where the problem "
                                          "accepts only inputs like get_inputs' own, define get_shifted_inputs() in "
                                          "it to choose that set; nothing was stored"),
}


@pytest.mark.parametrize("kind", list(FailureKind))
def test_judge_words_every_ending_as_the_harness_always_did(kind: FailureKind) -> None:
    assert kind in ENDINGS, f"{kind.value}: add its wording to ENDINGS"
    fields, extra, verdict, summary = ENDINGS[kind]
    judged = judge(Evidence(failure=Failure(kind=kind, **fields), **extra))  # type: ignore[arg-type]
    assert (judged.verdict, judged.summary, judged.flagged) == (verdict, summary, False)
    assert judged.settled


def test_only_the_machines_and_the_harnesss_endings_are_not_judged() -> None:
    assert {k for k in FailureKind if judge(Evidence(failure=Failure(kind=k))).not_judged} == {
        FailureKind.harness_out_of_memory, FailureKind.shifted_inputs_rejected}
    assert not judge(Evidence()).not_judged


def test_a_census_context_broken_late_names_the_candidates_last_call() -> None:
    broken = Failure(kind=FailureKind.census_context_broken, where="ModelNew.forward",
                     detail="CUDA error: an illegal memory access was encountered")
    assert judge(Evidence(failure=broken)).summary == (
        "crashed: the CUDA context of the census worker broke after ModelNew.forward: CUDA error: an illegal memory "
        "access was encountered")


def test_a_unit_this_machine_cannot_compile_fully_is_needs_gpu_with_the_note() -> None:
    unit = CompileUnit(kind="load_inline", name="ext", limited="c10/cuda/impl/cuda_cmake_macros.h, which "
                       "<c10/cuda/CUDAStream.h> includes, is missing here (torch here is the CPU build, without its "
                       "CUDA headers)")
    verdict, flagged, summary = decide(CompileResult(ok=True, arch="sm_90a", units=[unit]), [], [], None, gpu=False)
    assert verdict == Verdict.needs_gpu and not flagged
    assert summary == ("compiled (1 unit, sm_90a); verification and timing need a GPU; not compiled fully here, this "
                       f"machine's limit: ext: {unit.limited}")


def test_a_census_reply_is_judged_from_its_failure() -> None:
    taken = CensusReply(census={"available": True}, findings=[_FORGED])
    assert (taken.verdict, taken.summary, taken.clean) == (None, "", False)
    ended = CensusReply(failure=Failure(kind=FailureKind.census_context_broken))
    assert ended.verdict == Verdict.crashed and ended.summary == ENDINGS[FailureKind.census_context_broken][3]
    # Over the channel the census worker sends a kind, never a verdict: none of its kinds can claim a speedup.
    assert "verdict" not in CensusReply.model_fields and "verdict" not in Failure.model_fields
    assert {ENDINGS[k][2] for k in FailureKind} <= {Verdict.compile_error, Verdict.crashed, Verdict.timeout,
                                                    Verdict.invalid}


def test_no_module_of_the_harness_decides_a_verdict_but_verdict_py() -> None:
    root = Path(verdict_module.__file__).resolve().parents[2]  # harness/judgment/verdict.py -> the repository
    assert (root / "harness" / "pool" / "pool.py").is_file() and (root / "harness" / "worker" / "census.py").is_file()
    deciding = re.compile(r"verdict\s*=\s*Verdict\.")
    modules = [*(root / "harness").rglob("*.py"), *(root / "profiling").rglob("*.py")]
    found = [f"{p.relative_to(root)}:{n}" for p in sorted(modules) if p.name != "verdict.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if deciding.search(line)]
    assert not found, f"a verdict decided outside harness/judgment/verdict.py's judge: {found}"
    assert deciding.search("    verdict=Verdict.crashed,")  # the check can fail
