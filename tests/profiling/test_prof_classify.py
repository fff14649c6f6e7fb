"""The classifier labels each planted bottleneck, and the shared fixtures, correctly, with evidence
that really crosses its thresholds."""

from __future__ import annotations

import itertools
import operator

import pytest
from prof_fixtures import OWN, own_profile, shared_file

from kb_mcp.harness.profile_model import KernelMetrics, KernelProfile, Profile
from kb_mcp.policy.classify import classify_kernel, classify_profile
from kb_mcp.profiling.ncu_parse import parse_ncu_csv

# planted program -> expected (primary, secondary) of its kernel
PLANTED = {
    "stream": ("memory", "dram_bandwidth"),
    "strided": ("memory", "uncoalesced_access"),
    "fma": ("compute", "fp32_pipe"),
    "naive_gemm": ("compute", "tensor_cores_idle"),
    "bank_conflicts": ("memory", "bank_conflicts"),
    "one_block": ("latency", "too_few_blocks"),
    "divergence": ("compute", "divergence"),
    "atomics": ("memory", "atomics"),
    "spills": ("latency", "register_spills"),
    "tensor_gemm": ("latency", "register_occupancy"),
    "special_functions": ("compute", "special_functions"),
    "reg_occupancy": ("latency", "register_occupancy"),
    "smem_occupancy": ("latency", "shared_memory_occupancy"),
    "cublas_gemm": ("compute", "tensor_cores"),
}
RELATIONS = {">=": operator.ge, ">": operator.gt, "<": operator.lt, "<=": operator.le}


def _pair(c) -> tuple[str | None, str | None]:
    return (c.primary.value if c.primary else None, c.secondary.value if c.secondary else None)


def _check_evidence(c) -> None:
    assert c.evidence, "a classification must say why"
    for ev in c.evidence:
        if ev.threshold is not None and ev.relation:
            assert RELATIONS[ev.relation](ev.value, ev.threshold), ev
    assert 0.0 < c.confidence <= 1.0


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_kernel_is_labelled(name: str) -> None:
    if not (OWN / f"{name}.raw.csv").is_file():
        pytest.skip(f"{name} has not been recorded on a GPU yet (scripts/record_fixtures.py)")
    result = classify_profile(own_profile(name))
    heaviest = result.kernels[0]
    assert _pair(heaviest) == PLANTED[name], (heaviest.evidence, heaviest.alternatives)
    assert _pair(result.overall) == PLANTED[name]  # one kernel: the candidate is that kernel
    _check_evidence(heaviest)


def test_many_tiny_launches_are_launch_overhead_as_a_whole() -> None:
    result = classify_profile(own_profile("tiny_launches"))
    assert _pair(result.overall) == ("launch_overhead", "many_small_launches")
    assert result.basis == "many tiny launches"
    # the 24 identical launches fold into one entry; alone, each is a one-block kernel
    (entry,) = result.kernels
    assert entry.instances == 24 and entry.time_share == pytest.approx(1.0)
    assert _pair(entry) == ("latency", "too_few_blocks")
    _check_evidence(result.overall)


def test_profiler_rules_support_the_label() -> None:
    divergence = classify_profile(own_profile("divergence")).kernels[0]
    assert [r.rule for r in divergence.rules] == ["ThreadDivergence"]
    assert divergence.rules[0].estimated_speedup_pct and divergence.rules[0].estimated_speedup_pct > 50
    conflicts = classify_profile(own_profile("bank_conflicts")).kernels[0]
    assert conflicts.rules and conflicts.rules[0].rule == "SharedMemoryConflicts"


def test_rule_weight_decides_between_two_real_causes() -> None:
    """The WMMA GEMM has both 2-way bank conflicts and register-limited occupancy; the profiler
    estimates 57 % from occupancy and 15 % from the conflicts, and so does the ranking."""
    c = classify_profile(own_profile("tensor_gemm")).kernels[0]
    assert _pair(c) == ("latency", "register_occupancy")
    assert any(alt.startswith("memory/bank_conflicts") for alt in c.alternatives)


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("ncu_stream", ("memory", "dram_bandwidth")),
        ("ncu_fma", ("compute", "fp32_pipe")),
        ("ncu_tiny_grid", ("latency", "too_few_blocks")),
    ],
)
def test_shared_fixtures(prefix: str, expected: tuple[str, str]) -> None:
    raw = shared_file(f"{prefix}.raw.csv").read_text()
    details = shared_file(f"{prefix}.details.csv").read_text()
    result = classify_profile(Profile(profile_id="p_000000000000", problem=prefix, kernels=parse_ncu_csv(raw, details)))
    assert _pair(result.overall) == expected
    _check_evidence(result.overall)


def test_shared_launches_fixture_is_launch_overhead() -> None:
    raw = shared_file("ncu_launches.raw.csv").read_text()
    details = shared_file("ncu_launches.details.csv").read_text()
    result = classify_profile(Profile(profile_id="p_000000000000", problem="l", kernels=parse_ncu_csv(raw, details)))
    assert _pair(result.overall) == ("launch_overhead", "many_small_launches")


def test_shared_torch_elementwise_is_redundant_passes() -> None:
    """relu, mul, add as separate memory-bound kernels: what fusion would merge."""
    kernels = parse_ncu_csv(None, shared_file("ncu_torch_elementwise.metrics.csv").read_text())
    result = classify_profile(Profile(profile_id="p_000000000000", problem="t", kernels=kernels))
    assert _pair(result.overall) == ("memory", "redundant_passes")
    assert result.basis == "several memory-bound kernels"
    ev = {e.metric: e.value for e in result.overall.evidence}
    assert ev["memory_bound_kernels"] >= 3 and ev["memory_bound_time_share"] >= 0.5
    # heaviest first, identical launches folded
    shares = [k.time_share for k in result.kernels]
    assert shares == sorted(shares, reverse=True)


def test_time_weighting_picks_the_heavy_kernel_class() -> None:
    """Two kernels: a long compute-bound one and a short DRAM-bound one: the whole is compute-bound."""
    fma = own_profile("fma").kernels[0]
    stream = own_profile("stream").kernels[0]
    long_fma = fma.model_copy(update={"index": 0})
    short_stream = stream.model_copy(update={"index": 1})
    assert (long_fma.metrics.duration_ns or 0) > (short_stream.metrics.duration_ns or 0)
    result = classify_profile(Profile(profile_id="p_000000000000", problem="mix", kernels=[long_fma, short_stream]))
    assert _pair(result.overall) == ("compute", "fp32_pipe")
    assert result.basis == "time-weighted over kernels"
    assert [k.index for k in result.kernels] == [0, 1]


def test_timings_only_kernels_are_not_guessed() -> None:
    k = KernelProfile(index=0, name="k", full_name="k", grid=(4096, 1, 1), block=(256, 1, 1),
                      metrics=KernelMetrics(duration_ns=50_000.0))
    c = classify_kernel(k)
    assert c.primary is None and "no hardware counters" in c.note
    one_block = k.model_copy(update={"grid": (1, 1, 1)})
    assert _pair(classify_kernel(one_block)) == ("latency", "too_few_blocks")  # the grid alone says so


def test_classification_is_deterministic() -> None:
    a = classify_profile(own_profile("spills")).model_dump()
    b = classify_profile(own_profile("spills")).model_dump()
    assert a == b


def _one(metrics: KernelMetrics, grid: tuple[int, int, int] = (4096, 1, 1)) -> tuple[str | None, str | None]:
    k = KernelProfile(index=0, name="k", full_name="k", grid=grid, block=(256, 1, 1), metrics=metrics)
    return _pair(classify_kernel(k))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"sm_throughput_pct": 75, "memory_throughput_pct": 80, "dram_throughput_pct": 78, "fma_pipe_pct": 40},
         ("hybrid", "balanced_high")),
        ({"sm_throughput_pct": 50, "memory_throughput_pct": 48, "dram_throughput_pct": 40},
         ("hybrid", "balanced_moderate")),
        ({"sm_throughput_pct": 20, "memory_throughput_pct": 85, "dram_throughput_pct": 15, "l2_throughput_pct": 85,
          "l2_hit_rate_pct": 30}, ("memory", "cache_misses")),
        ({"sm_throughput_pct": 85, "memory_throughput_pct": 10, "fma_pipe_pct": 20, "xu_pipe_pct": 5},
         ("compute", "instruction_mix")),
        ({"sm_throughput_pct": 15, "memory_throughput_pct": 45, "dram_throughput_pct": 44,
          "warp_stalls": {"long_scoreboard": 30.0}}, ("memory", "insufficient_bytes_in_flight")),
        ({"sm_throughput_pct": 10, "memory_throughput_pct": 10, "warp_stalls": {"barrier": 12.0, "wait": 1.0}},
         ("latency", "sync_stalls")),
        ({"sm_throughput_pct": 10, "memory_throughput_pct": 12, "warp_stalls": {"long_scoreboard": 20.0}},
         ("latency", "memory_stalls")),
    ],
)
def test_throughput_classes(fields: dict, expected: tuple[str, str]) -> None:
    assert _one(KernelMetrics(duration_ns=1e6, **fields)) == expected


def test_a_saturated_tensor_pipe_wins_over_busy_operand_traffic() -> None:
    """cuBLAS: SM 92 % and memory 94 % (shared-memory operands), tensor pipe 95 %: tensor-core bound."""
    c = classify_profile(own_profile("cublas_gemm")).kernels[0]
    assert _pair(c) == ("compute", "tensor_cores")
    assert {e.metric: e.value for e in c.evidence}["tensor_pipe_pct"] >= 80


FULL = {"sm_throughput_pct": 20.0, "memory_throughput_pct": 86.0, "dram_throughput_pct": 85.0,
        "l1_throughput_pct": 30.0, "l2_throughput_pct": 40.0, "l2_hit_rate_pct": 50.0, "fma_pipe_pct": 10.0}


@pytest.mark.parametrize("kept", [dict(c) for n in range(1, len(FULL)) for c in itertools.combinations(FULL.items(), n)
                                  if "sm_throughput_pct" in dict(c) or "dram_throughput_pct" in dict(c)][:64])
def test_evidence_shows_only_metrics_that_were_given_with_their_given_values(kept: dict[str, float]) -> None:
    k = KernelProfile(index=0, name="k", full_name="k", grid=(4096, 1, 1), block=(256, 1, 1),
                      metrics=KernelMetrics(duration_ns=1e6, **kept))
    c = classify_kernel(k)
    shown = {ev.metric: ev.value for ev in c.evidence if ev.metric in KernelMetrics.model_fields}
    assert shown.items() <= kept.items(), (kept, shown)


def test_dram_throughput_stands_in_for_a_missing_memory_throughput() -> None:
    """A bandwidth-bound kernel described by DRAM and SM throughput alone is bandwidth-bound, not
    latency-bound for a memory throughput of 0 that nobody measured."""
    given = KernelMetrics(duration_ns=1e6, dram_throughput_pct=85, sm_throughput_pct=20)
    c = classify_kernel(KernelProfile(index=0, name="k", full_name="k", grid=(4096, 1, 1), block=(256, 1, 1),
                                      metrics=given))
    assert _pair(c) == ("memory", "dram_bandwidth")
    assert [(e.metric, e.value) for e in c.evidence] == [("dram_throughput_pct", 85.0)]
    assert c.missing == ["memory_throughput_pct"]
    assert _one(given.model_copy(update={"memory_throughput_pct": 86})) == ("memory", "dram_bandwidth")
