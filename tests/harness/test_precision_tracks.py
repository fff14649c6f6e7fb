"""Precision tracks (harness.verdict, harness.worker.values, harness.precision): track selection and
tolerances, the track as a score key of its own, the SASS of real nvcc builds read for the precision
a kernel computes in, and the one function that judges a verification's evidence."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from harness_helpers import FIXTURES, fixture_source

from kb_mcp.harness.judgment.options import TRACK_TOLERANCE, assess_options
from kb_mcp.harness.judgment.precision import (
    PrecisionEvidence,
    allowed,
    dtypes_named,
    instruction_precision,
    precision_check,
    precision_findings,
    sass_precisions,
)
from kb_mcp.harness.judgment.probing import PrecisionCheck, ProbeError, judged
from kb_mcp.harness.judgment.verdict import (
    CompileResult,
    CompileUnit,
    Evidence,
    Failure,
    FailureKind,
    Finding,
    FindingCode,
    Timings,
    VerifyOptions,
    judge,
)
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.worker.values import DEFAULT_TOLERANCES, tolerance_for
from kb_mcp.kb.models import Strength, Track, Verdict
from kb_mcp.tools import compile_and_verify as tool
from kb_mcp.tools.context import ToolContext

SASS = Path(__file__).parent / "data" / "sass"


def _sass(name: str) -> str:
    return (SASS / name).read_text()


# -- reading SASS (real cuobjdump -sass output of sm_90a cubins, sources beside them) -------------


def test_wmma_kernels_are_read_by_their_tensor_core_input_type() -> None:
    found = sass_precisions(_sass("wmma_kernels.sm_90a.sass"))
    assert found == {"mm_tf32": ["tf32"], "mm_bf16": ["bf16"], "mm_f16": ["fp16"], "mm_f16acc": ["fp16"]}
    # plain fp32 FMA, and bf16 arithmetic outside the tensor cores, are not tensor-core precisions
    assert "saxpy" not in found and "to_bf16_math" not in found


def test_wgmma_kernels_are_read_too() -> None:
    assert sass_precisions(_sass("wgmma_kernels.sm_90a.sass")) == {
        "wg_bf16": ["bf16"], "wg_f16": ["fp16"], "wg_e4m3": ["fp8"]}  # DMMA (fp64) is no lowering
    [(kernel, precisions)] = sass_precisions(_sass("linear_wgmma_tf32.sm_90a.sass")).items()
    assert "linear_wgmma" in kernel and precisions == ["tf32"]


@pytest.mark.parametrize(("op", "mods", "want"), [
    ("HMMA", "1688.F32.TF32", "tf32"), ("HMMA", "16816.F32.BF16", "bf16"), ("HMMA", "16816.F32", "fp16"),
    ("HGMMA", "64x128x16.F32.BF16", "bf16"), ("QGMMA", "64x64x32.F32.E4M3.E4M3", "fp8"),
    ("IMMA", "16832.S8.S8", "int8"),
])
def test_instruction_types(op: str, mods: str, want: str) -> None:
    assert instruction_precision(op, mods) == want


def test_what_each_track_allows() -> None:
    assert allowed(Track.fp32) == frozenset()
    assert allowed(Track.tf32) == {"tf32"}
    assert allowed(Track.bf16) == {"tf32", "bf16"} and allowed(Track.fp16) == {"tf32", "fp16"}
    assert allowed(Track.fp32, ["bfloat16"]) == {"tf32", "bf16"}  # a bf16 problem computes in bf16
    assert "fp8" not in allowed(Track.fp16, ["float16", "bfloat16"])  # no track allows fp8


def test_kernels_beyond_the_track_get_a_precision_check_not_a_verdict() -> None:
    ev = PrecisionEvidence()
    ev.merge("linear", sass_precisions(_sass("wmma_kernels.sm_90a.sass")))
    tf32_only = PrecisionEvidence(kernels={"k": ["tf32"]})
    check = precision_check(tf32_only, Track.fp32)
    assert check is not None and check.status == "pending" and check.kernels == {"k": ["tf32"]}
    assert precision_findings(check) == []  # pending: the probes decide, on a GPU
    assert precision_check(tf32_only, Track.tf32) is None
    bf16 = PrecisionEvidence(kernels={"k": ["bf16"]})
    assert precision_check(bf16, Track.tf32) is not None
    assert precision_check(bf16, Track.bf16) is None and precision_check(bf16, Track.fp32, ["bfloat16"]) is None
    fp16_track = precision_check(ev, Track.fp16)
    assert fp16_track is not None and set(fp16_track.kernels) == {"mm_bf16"}  # bf16 is not allowed in fp16
    assert precision_check(None, Track.fp32) is None


def test_precision_findings_follow_the_probes() -> None:
    check = PrecisionCheck(track=Track.fp32, kernels={"k": ["tf32"]})
    passed = judged(check, [ProbeError(probe="own", ratio=1.1, reference_rms=1e-7, reference_max=1e-6)])
    assert precision_findings(passed) == []
    failed = judged(check, [ProbeError(probe="own", ratio=1.1e3, reference_rms=1e-7, reference_max=1e-6),
                            ProbeError(probe="low_bits", note="the float64 reference is not finite on these inputs")])
    [f] = precision_findings(failed)
    assert f.code == FindingCode.precision_lowered and f.source == "runtime"
    assert "k (tf32)" in f.message and "plain TF32" in f.message and "own 1.1e+03x" in f.message
    assert "low_bits (the float64 reference is not finite" in f.message and "tf32 or bf16 or fp16 track" in f.message
    blind = judged(check, [ProbeError(probe="own", note="the float64 reference ran out of GPU memory")])
    [b] = precision_findings(blind)  # no probe ran: the SASS decides, as before the probes
    assert b.code == FindingCode.precision_lowered and "(their SASS)" in b.message
    assert "could not judge them (no probe could run)" in b.message


def test_the_dtypes_a_problem_names() -> None:
    assert dtypes_named("x = torch.randn(4, dtype=torch.float16)") == ["float16"]
    assert dtypes_named("w = w.bfloat16()") == ["bfloat16"]
    assert dtypes_named(fixture_source("linear_offset_problem.py")) == []


# -- tracks: selection, tolerances, strength -------------------------------------------------------


def test_track_selection_and_its_default() -> None:
    assert VerifyOptions().track == Track.fp32
    assert VerifyOptions.model_validate({"track": "bf16"}).track == Track.bf16
    with pytest.raises(ValueError):
        VerifyOptions.model_validate({"track": "fp8"})


def test_tolerances_per_track() -> None:
    strict = DEFAULT_TOLERANCES["float32"]
    assert tolerance_for(torch.float32, None, None, VerifyOptions()) == (*strict, "")
    for track in (Track.tf32, Track.bf16, Track.fp16):
        assert tolerance_for(torch.float32, None, None, VerifyOptions(track=track)) == (*TRACK_TOLERANCE[track], "")
    # the dtype's own tolerance stands where it is looser than the track's floor
    bf16 = VerifyOptions(track=Track.bf16)
    assert tolerance_for(torch.bfloat16, None, None, bf16)[:2] == DEFAULT_TOLERANCES["bfloat16"]
    # a problem's own constants are raised to the floor, never lowered by it
    assert tolerance_for(torch.float32, 1e-3, 1e-3, VerifyOptions(track=Track.tf32))[:2] == (1e-2, 1e-2)
    # the caller loosening a low track's tolerance is still a loosening, tightening it is not
    assert tolerance_for(torch.float32, None, None, VerifyOptions(track=Track.tf32, atol=5e-2))[2]
    assert tolerance_for(torch.float32, None, None, VerifyOptions(track=Track.tf32, atol=5e-3))[2] == ""
    exact = tolerance_for(torch.int64, None, None, VerifyOptions(track=Track.tf32))
    assert exact[:2] == (0.0, 0.0)  # exact stays exact


def test_another_track_is_its_own_key_not_a_loosening() -> None:
    strict = assess_options(VerifyOptions(), gpu=True)
    tf32 = assess_options(VerifyOptions(track=Track.tf32), gpu=True)
    assert strict.strength == tf32.strength == Strength.standard and tf32.loosened == []
    assert tf32.options == {"track": "tf32"} and strict.options == {}
    assert assess_options(VerifyOptions(track=Track.bf16), gpu=False).strength == Strength.compile_only
    assert assess_options(VerifyOptions(track=Track.bf16, timing=False), gpu=True).strength == Strength.quick


# -- the one function that judges --------------------------------------------------------------------


def test_judge_reads_failures_and_findings() -> None:
    ok = CompileResult(ok=True)
    crashed = judge(Evidence(compile=ok, failure=Failure(kind=FailureKind.cuda_error, where="ModelNew.forward",
                                                         detail="illegal address", context_healthy=False)))
    assert crashed.verdict == Verdict.crashed and crashed.settled
    assert crashed.summary == ("crashed: ModelNew.forward raised a CUDA error (the CUDA context is corrupted; worker "
                               "replaced): illegal address")
    missing = "the candidate defines no class ModelNew"
    no_model = judge(Evidence(failure=Failure(kind=FailureKind.no_model, detail=missing)))
    assert (no_model.verdict, no_model.summary) == (Verdict.compile_error, f"compile error: {missing}")
    built = judge(Evidence(compile=CompileResult(ok=False, messages=["k.cu(3): error"]),
                           failure=Failure(kind=FailureKind.build_failed)))
    assert (built.verdict, built.summary) == (Verdict.compile_error, "compile error: k.cu(3): error")
    census = Failure(kind=FailureKind.census_timed_out, where="running forward for the kernel census", limit_s=3)
    reported = judge(Evidence(failure=census))
    assert reported.verdict == Verdict.timeout
    assert reported.summary.startswith("timeout: no answer within 3 s while running forward for the kernel census")
    pending = judge(Evidence(compile=ok))
    assert pending.verdict == Verdict.needs_gpu and not pending.settled
    lowered = judge(Evidence(compile=ok, findings=[Finding(code=FindingCode.precision_lowered, message="tf32")]))
    assert lowered.verdict == Verdict.incorrect and lowered.settled
    assert lowered.summary == "incorrect (precision_lowered): tf32"


def test_judge_names_the_precision_evidence() -> None:
    check = PrecisionCheck(track=Track.fp32, kernels={"linear_mma": ["tf32"]})
    built = CompileResult(ok=True, arch="sm_90a", units=[CompileUnit(kind="nvrtc", name="linear_mma")])
    pending = judge(Evidence(compile=built, precision=check))
    assert pending.verdict == Verdict.needs_gpu
    assert pending.summary.endswith("verification and timing need a GPU; the kernels linear_mma (tf32) compute on "
                                    "the tensor cores in tf32 (their SASS), which the fp32 track accepts only at "
                                    "the strict reference's accuracy: precision probes on a GPU will judge them")
    probes = [ProbeError(probe=p, ratio=r, reference_rms=1e-7, reference_max=1e-6)
              for p, r in (("own", 1.02), ("low_bits", 0.9), ("mixed_magnitudes", 1.3), ("same_sign", 1.1))]
    timed = Timings(candidate_ms=1.0, candidate_min_ms=1.0, candidate_host_ms=1.0, runs=10, eager_ms=2.0,
                    speedup_vs_baseline=2.0)
    faster = judge(Evidence(compile=built, timings=timed, precision=judged(check, probes)))
    assert faster.verdict == Verdict.faster
    assert ("precision: TF32 tensor-core instructions with an error at the strict reference's level (worst 1.3x, "
            "bound 32x): an error-compensated scheme such as 3xTF32") in faster.summary
    assert ("probes (error against a float64 reference / the strict reference's, TF32 off): own 1.02x, low_bits "
            "0.9x") in faster.summary


# -- the compile-only path: SASS read in the sandbox, a score key per track -------------------------


@pytest.fixture
def ctx(tmp_path):
    c = ToolContext(tmp_path / "kb.json", cache_dir=tmp_path / "cache")
    c.__dict__["workers"] = WorkerPool(c.cache_dir, no_cuda=True)  # compile-only on any machine
    yield c
    c.close()


@pytest.mark.nvcc
def test_compile_only_reads_the_precision_and_keys_each_track_apart(ctx) -> None:
    from kb_mcp.harness.builds.builds import toolchain

    if toolchain(ctx.workers.sandbox).cuobjdump is None:
        pytest.skip("no cuobjdump (CUDA toolkit or the nvidia-cuda-cuobjdump wheel)")
    problem, candidate = str(FIXTURES / "linear_offset_problem.py"), fixture_source("linear_mma_tf32.py")
    strict = tool.run(ctx, tool.Request(problem=problem, candidate=candidate))
    # TF32 instructions in the fp32 track: not a verdict without a GPU, where the precision probes judge it
    assert strict.record.verdict == Verdict.needs_gpu and strict.record.track == Track.fp32
    assert strict.record.findings == [] and "HMMA" not in strict.summary
    assert "linear_mma_tf32 (tf32)" in strict.summary and "precision probes on a GPU will judge" in strict.summary
    assert strict.precision is not None and strict.precision.status == "pending"
    assert strict.precision.kernels == {"linear_mma_tf32": ["tf32"]} and strict.precision.probes == []
    tf32 = tool.run(ctx, tool.Request(problem=problem, candidate=candidate, options=VerifyOptions(track=Track.tf32)))
    assert tf32.record.verdict == Verdict.needs_gpu and tf32.record.track == Track.tf32 and tf32.precision is None
    assert "precision probes" not in tf32.summary
    assert tf32.record.options == {"track": "tf32"} and tf32.record.strength == Strength.compile_only
    assert tf32.record.key != strict.record.key  # two keys: neither verdict replaces the other
    with ctx.store.read() as kb:
        stored = {v.track: v.verdict for v in kb.candidate_verdicts(strict.record.candidate_id)}
    assert stored == {Track.fp32: Verdict.needs_gpu, Track.tf32: Verdict.needs_gpu}
    # the bf16 candidate: to be probed in tf32, allowed in bf16; the plain fp32 one is fine everywhere
    bf16 = fixture_source("linear_mma_bf16.py")
    in_tf32 = tool.run(ctx, tool.Request(problem=problem, candidate=bf16, options=VerifyOptions(track=Track.tf32)))
    assert in_tf32.record.verdict == Verdict.needs_gpu and in_tf32.precision is not None
    assert in_tf32.precision.kernels == {"linear_mma_bf16": ["bf16"]}
    in_bf16 = tool.run(ctx, tool.Request(problem=problem, candidate=bf16, options=VerifyOptions(track=Track.bf16)))
    assert in_bf16.record.verdict == Verdict.needs_gpu and in_bf16.precision is None
    relu = tool.run(ctx, tool.Request(problem=str(FIXTURES / "relu_problem.py"),
                                      candidate=fixture_source("relu_nvrtc.py")))
    assert relu.record.verdict == Verdict.needs_gpu and relu.compile.ok


@pytest.mark.nvcc
@pytest.mark.parametrize(("fixture", "kernel"), [("linear_mma_3xtf32.py", "linear_mma_3xtf32"),
                                                 ("linear_wgmma_3xtf32.py", "linear_wgmma")])
def test_the_3xtf32_candidates_build_for_sm_90a_and_wait_for_their_probes(ctx, fixture: str, kernel: str) -> None:
    from kb_mcp.harness.builds.builds import toolchain

    if toolchain(ctx.workers.sandbox).cuobjdump is None:
        pytest.skip("no cuobjdump (CUDA toolkit or the nvidia-cuda-cuobjdump wheel)")
    problem = str(FIXTURES / "linear_offset_problem.py")
    result = tool.run(ctx, tool.Request(problem=problem, candidate=fixture_source(fixture)))
    assert result.record.verdict == Verdict.needs_gpu and result.compile.ok and result.record.findings == []
    assert result.precision is not None and result.precision.status == "pending", result.summary
    [(symbol, precisions)] = result.precision.kernels.items()
    assert kernel in symbol and precisions == ["tf32"]  # TF32 tensor-core instructions: the probes decide


@pytest.mark.nvcc
def test_the_disassembler_runs_in_the_sandbox_and_caches(tmp_path) -> None:
    from kb_mcp.harness.builds.builds import toolchain
    from kb_mcp.harness.builds.compile_only import CompileOnly
    from kb_mcp.harness.sandbox.sandbox import detect

    sandbox = detect()
    tool_path = toolchain(sandbox).cuobjdump
    if tool_path is None:
        pytest.skip("no cuobjdump (CUDA toolkit or the nvidia-cuda-cuobjdump wheel)")
    cubin = tmp_path / "k.cubin"
    import subprocess

    src = tmp_path / "k.cu"
    shutil.copy(SASS / "wmma_kernels.cu", src)
    subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-o", str(cubin), str(src)], check=True, capture_output=True)
    dis = CompileOnly(tmp_path / "cache", sandbox).disassembler()
    found, why = dis.precisions(cubin)
    assert why == "" and found == sass_precisions(_sass("wmma_kernels.sm_90a.sass"))
    assert len(list((tmp_path / "cache" / "sass").glob("*.json"))) == 1  # cached by content
    assert dis.precisions(cubin) == (found, "")
    missing, why = dis.precisions(tmp_path / "nope.so")
    assert missing is None and "unreadable" in why
