"""The work bound of a candidate, escalation and its verdicts (`harness.plausibility`, `decide`), on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.harness.judgment.verdict import CompileResult, FindingCode, InputSetCheck, Timings, decide
from kb_mcp.harness.plausibility import (
    FALLBACK_SM_CLOCK_HZ,
    DevicePeaks,
    KernelWork,
    WorkCensus,
    escalation_reasons,
    impossible_time,
    unsettled,
    work_bound,
    work_census_from_profiles,
)
from kb_mcp.harness.shapes import size_constants
from kb_mcp.kb.models import Verdict
from kb_mcp.profiling import ncu_parse

NCU = Path(__file__).parents[1] / "fixtures" / "ncu"
# An H100 SXM as CUDA reports it: HBM3 at 2619 MHz over 5120 bits, 132 SMs at 1980 MHz, 50 MiB of L2.
H100 = DevicePeaks(dram_bytes_per_s=2619e6 * 2 * 5120 / 8, sm_count=132, sm_clock_hz=1.98e9, l2_bytes=50 << 20)
OK = CompileResult(ok=True, style="nvrtc", arch="sm_90")
SETS = [InputSetCheck(index=i, kind="secret", passed=True, numel=10) for i in range(6)]


def _timings(cand: float, eager: float = 1.0, bound: float | None = None) -> Timings:
    return Timings(candidate_ms=cand, candidate_min_ms=cand, candidate_host_ms=cand, runs=20, eager_ms=eager,
                   speedup_vs_eager=eager / cand, speedup_vs_baseline=eager / cand, bound_ms=bound)


@pytest.mark.parametrize("raw", sorted(NCU.glob("*.raw.csv")), ids=lambda p: p.name.split(".")[0])
def test_the_bound_of_recorded_h100_kernels_is_never_above_their_measured_time(raw: Path) -> None:
    # Recorded under ncu (clocks locked to base, below boost): a true lower bound stays below them all.
    census = work_census_from_profiles(ncu_parse.parse_ncu_csv(raw.read_text(), None))
    bound = work_bound(census, H100)
    assert bound is not None and census.available
    measured_ms = sum(k.duration_ns or 0.0 for k in census.kernels) / 1e6
    assert 0.0 <= bound.ms < measured_ms


def test_the_bound_is_tight_where_one_resource_is_saturated() -> None:
    # A bound far below every real time would catch nothing: the streaming and FMA kernels come close.
    for name, limit in (("stream", "dram"), ("fma", "issue")):
        census = work_census_from_profiles(ncu_parse.parse_ncu_csv((NCU / f"{name}.raw.csv").read_text(), None))
        bound = work_bound(census, H100)
        assert bound is not None and bound.limit == limit
        assert bound.ms > 0.7 * sum(k.duration_ns or 0.0 for k in census.kernels) / 1e6


def test_a_census_of_the_work_metrics_alone_parses() -> None:
    # What `profiling.work` asks ncu for: no sections, four metrics.
    text = ('"ID","Kernel Name","Block Size","Grid Size","dram__bytes_read.sum","dram__bytes_write.sum",'
            '"gpu__time_duration.sum","smsp__inst_executed.sum"\n'
            '"","","","","byte","byte","ns","inst"\n'
            '"0","colsum(const float *, float *, int, int)","(256, 1, 1)","(16, 64, 1)","67,141,632","262,144",'
            '"25,120","1,048,576"\n'
            '"1","rowdot(const float *, const float *, float *, int)","(256, 1, 1)","(1024, 1, 1)",'
            '"16,777,216","4,096",'
            '"9,000","524,288"\n')
    census = work_census_from_profiles(ncu_parse.parse_ncu_csv(text, None))
    assert [k.name for k in census.kernels] == ["colsum", "rowdot"]
    assert census.kernels[0].dram_read_bytes == 67_141_632 and census.kernels[1].warp_instructions == 524_288
    assert census.dram_bytes == 67_141_632 + 262_144 + 16_777_216 + 4_096


def test_later_kernels_and_writes_count_beyond_one_l2() -> None:
    mb = 1 << 20
    census = WorkCensus(available=True, kernels=[
        KernelWork(name="a", dram_read_bytes=100 * mb, dram_write_bytes=10 * mb, warp_instructions=0),
        KernelWork(name="b", dram_read_bytes=100 * mb, dram_write_bytes=80 * mb, warp_instructions=0),
    ])
    bound = work_bound(census, DevicePeaks(dram_bytes_per_s=1e12, sm_count=1, l2_bytes=50 * mb))
    assert bound is not None
    # a: all 100 MB read (the timer empties L2 first); its 10 MB written may stay in L2.
    # b: 50 of its 100 MB may be found in L2; 30 of its 80 MB written must reach DRAM.
    assert bound.dram_bytes == (100 + 50 + 30) * mb
    assert bound.dram_ms == pytest.approx(180 * mb / 1e12 * 1e3)


def test_no_bound_without_counters_or_peaks() -> None:
    assert work_bound(None, H100) is None
    assert work_bound(WorkCensus(available=False, note="ncu missing"), H100) is None
    census = WorkCensus(available=True, kernels=[KernelWork(name="k", dram_read_bytes=1e6, dram_write_bytes=0)])
    assert work_bound(census, DevicePeaks()) is None
    # An unknown clock is taken as higher than any GPU's: the bound gets lower, never higher.
    assert DevicePeaks(sm_count=10).issue_per_s == 10 * 4 * FALLBACK_SM_CLOCK_HZ


def test_a_time_below_the_candidates_own_work_is_impossible() -> None:
    census = WorkCensus(available=True, kernels=[
        KernelWork(name="k", dram_read_bytes=64e6, dram_write_bytes=0, warp_instructions=1e6)])
    bound = work_bound(census, H100)
    assert bound is not None and bound.limit == "dram"
    found = impossible_time(0.5 * bound.ms, bound)
    assert found is not None and found.code == FindingCode.impossible_time and "64 MB" in found.message
    assert impossible_time(0.9 * bound.ms, bound) is None
    verdict, _, summary = decide(OK, SETS, [found], _timings(0.5 * bound.ms))
    assert verdict == Verdict.invalid and "impossible_time" in summary


def test_escalation_reasons() -> None:
    assert escalation_reasons(_timings(0.5, eager=1.0, bound=0.1), factor=50) == []
    fast = escalation_reasons(_timings(0.01, eager=1.0), factor=50)
    assert len(fast) == 1 and "100.0x" in fast[0]
    below = escalation_reasons(_timings(0.05, eager=0.2, bound=0.1), factor=50)
    assert len(below) == 1 and "roofline" in below[0]


def test_an_escalated_result_counts_with_its_evidence_or_is_held_with_the_reason() -> None:
    t = _timings(0.01)
    t.evidence = ["escalated (speedup 100.0x ...)", "11 more input sets correct", "its own work takes at least 8 us"]
    sets = SETS + [InputSetCheck(index=6, kind="perturbed", passed=True, skipped=True,
                                 message="could not run for linear.weight: ...")]
    verdict, flagged, summary = decide(OK, sets, [], t)
    assert verdict == Verdict.faster and not flagged
    assert "6 input sets correct" in summary and "not run: perturbed: could not run for linear.weight" in summary
    assert "evidence: escalated" in summary and "8 us" in summary
    held = unsettled(["speedup 100.0x"], "its own work could not be measured (ncu was not found)")
    verdict, flagged, summary = decide(OK, SETS, [held], t)
    assert verdict == Verdict.faster and flagged and "ncu was not found" in summary


def _linear_sum_sizes() -> tuple[int, int, int]:
    source = (Path(__file__).resolve().parents[2] / "examples" / "problems" / "linear_sum.py").read_text()
    sizes = size_constants(source)
    return sizes["BATCH"], sizes["IN_FEATURES"], sizes["OUT_FEATURES"]


def test_linear_sum_leaves_its_exact_rewrite_room_above_the_gpu_tests_threshold() -> None:
    # tests/harness/test_evidence_gpu.py escalates at 4x. Eager's FP32 GEMM cannot beat the H100 SXM's
    # non-tensor peak (132 SMs x 128 lanes x 2 FLOPs at 1.98 GHz); the rewrite's call from Python
    # costs at most ~0.45 ms of host time in the worker. Twice the threshold at least.
    batch, cols, rows = _linear_sum_sizes()
    eager_ms = 2 * batch * cols * rows / (132 * 128 * 2 * 1.98e9) * 1e3
    assert eager_ms / 0.45 > 2 * 4.0


def test_linear_sum_rewrite_at_its_sizes_is_clear_of_its_own_work_bound() -> None:
    # The three kernels of examples/candidates/linear_sum_rewrite_nvrtc.py and the bytes they move.
    batch, cols, rows = _linear_sum_sizes()
    chunks = 64
    census = WorkCensus(available=True, kernels=[
        KernelWork(name="colsum_partial", dram_read_bytes=4.0 * rows * cols, dram_write_bytes=4.0 * chunks * cols,
                   warp_instructions=rows * cols / 32 * 6),
        KernelWork(name="colsum_finish", dram_read_bytes=4.0 * (chunks * cols + rows),
                   dram_write_bytes=4.0 * (cols + 1), warp_instructions=chunks * cols / 32 * 8),
        KernelWork(name="row_dot", dram_read_bytes=4.0 * (batch * cols + cols + 1), dram_write_bytes=4.0 * batch,
                   warp_instructions=batch * cols / 32 * 8),
    ])
    bound = work_bound(census, H100)
    assert bound is not None and bound.limit == "dram"
    # W once, x beyond the L2 a kernel may find it in: ~44 us. The escalation has something to check...
    assert 0.03 < bound.ms < 0.06
    # ...and honest kernels moving all of it at 93 % of the peak (~65 us), let alone with the host's
    # time for the call, stay far above the impossible line.
    honest_ms = census.dram_bytes / (0.93 * (H100.dram_bytes_per_s or 0.0)) * 1e3
    assert impossible_time(honest_ms, bound) is None


def test_a_gemm_hidden_from_the_events_cannot_fit_in_a_millisecond() -> None:
    # tests/adversarial/cheats/linear_sum_hidden_stream.py: its own GEMM on a side stream. Its FFMAs
    # alone (one warp instruction per 32 multiply-adds) exceed 4 ms of the H100's issue rate.
    batch, cols, rows = _linear_sum_sizes()
    census = WorkCensus(available=True, kernels=[
        KernelWork(name="gemm_rowsum", dram_read_bytes=4.0 * (batch + rows) * cols, dram_write_bytes=0.0,
                   warp_instructions=batch * cols * rows / 32),
    ])
    bound = work_bound(census, H100)
    assert bound is not None and bound.limit == "issue" and bound.ms > 4.0
    found = impossible_time(1.0, bound)
    assert found is not None and "warp instructions" in found.message
