"""compile_and_verify's result shows device time beside end-to-end time (no GPU needed: the
result is summarised from a verdict as the harness returns it)."""

from __future__ import annotations

from kb_mcp.harness.judgment.verdict import CompileResult, InputSetCheck, Timings, VerifyOptions, VerifyResult, decide
from kb_mcp.tools.compile_and_verify import summarize


def test_the_tool_result_carries_device_and_end_to_end_times() -> None:
    timings = Timings(candidate_ms=0.012, candidate_min_ms=0.011, candidate_host_ms=0.02, runs=100, eager_ms=0.4,
                      speedup_vs_eager=33.33, speedup_vs_baseline=33.33, candidate_device_ms=0.003,
                      candidate_kernels=1, eager_device_ms=0.1, speedup_device_vs_eager=33.33)
    sets = [InputSetCheck(index=i, kind="secret", passed=True) for i in range(6)]
    verdict, flagged, summary = decide(CompileResult(ok=True), sets, [], timings)
    result = VerifyResult(candidate_id="c1", problem="p", problem_hash="h", verdict=verdict, summary=summary,
                          flagged=flagged, compile=CompileResult(ok=True), input_sets=sets, timings=timings,
                          device="NVIDIA H100", arch="sm_90")
    record = result.record(VerifyOptions())
    out = summarize(result, record, None, "/tmp/c1.py", detail=False)
    assert out.timings is not None and out.timings.candidate_device_ms == 0.003
    assert out.timings.eager_device_ms == 0.1 and out.timings.candidate_ms == 0.012
    assert (out.record.device_ms, out.record.eager_device_ms) == (0.003, 0.1)
    assert "; device 0.003 ms vs eager 0.1 ms (33.33x);" in out.summary
    shown = out.model_dump(mode="json")
    assert shown["timings"]["candidate_device_ms"] == 0.003 and shown["record"]["device_ms"] == 0.003


def test_the_tool_result_says_where_the_verification_time_went() -> None:
    sets = [InputSetCheck(index=i, kind="secret", passed=True) for i in range(6)]
    timings = Timings(candidate_ms=0.2, candidate_min_ms=0.19, candidate_host_ms=0.21, runs=100, eager_ms=0.4,
                      speedup_vs_eager=2.0, speedup_vs_baseline=2.0)
    verdict, flagged, summary = decide(CompileResult(ok=True), sets, [], timings)
    phases = {"queued": 0.5, "import": 2.0, "check": 3.0, "timing": 4.0}
    result = VerifyResult(candidate_id="c1", problem="p", problem_hash="h", verdict=verdict, summary=summary,
                          flagged=flagged, compile=CompileResult(ok=True), input_sets=sets, timings=timings,
                          elapsed_s=9.5, phases_s=phases, device="NVIDIA H100", arch="sm_90")
    out = summarize(result, result.record(VerifyOptions()), None, "/tmp/c1.py", detail=False)
    shown = out.model_dump(mode="json")
    assert (shown["elapsed_s"], shown["phases_s"]) == (9.5, phases)
