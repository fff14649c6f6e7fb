"""ncu CSV pages -> KernelProfiles, on real recorded output (ours in base units, the shared ones as
imported reports with auto-scaled units and thousands separators)."""

from __future__ import annotations

import pytest
from prof_fixtures import OWN, own_profile, shared_file

from kb_mcp.profiling import ncu_parse
from kb_mcp.profiling.ncu_parse import NcuParseError, parse_ncu_csv, parse_number, short_name, unit_factor


def test_units_and_separators_convert_to_base() -> None:
    assert parse_number("463,996", "cycle") == 463996.0
    assert parse_number("291.84", "us") == pytest.approx(291840.0)
    assert parse_number("1.024000", "Kbyte/block") == pytest.approx(1024.0)
    assert parse_number("2.62", "Ghz") == pytest.approx(2.62e9)
    assert parse_number("81.3", "%") == 81.3
    assert parse_number("no data", "inst") is None and parse_number("", "") is None
    assert unit_factor("Gbyte/s") == 1e9 and unit_factor("ns") == 1.0 and unit_factor("register/thread") == 1.0


@pytest.mark.parametrize(
    ("full", "short"),
    [
        ("stream_add(const float *, const float *, float *, unsigned long)", "stream_add"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
         "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(int, float)",
         "vectorized_elementwise_kernel"),
        ("void unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, void templates::normal<float>"
         "(T1)::[lambda() (instance 1)]>(long, PhiloxCudaState, T3, T4)",
         "distribution_elementwise_grid_stride_kernel"),
        ("fused_relu_mul_add", "fused_relu_mul_add"),
    ],
)
def test_short_names(full: str, short: str) -> None:
    assert short_name(full) == short


def test_shared_imported_report_parses_in_base_units() -> None:
    raw = shared_file("ncu_stream.raw.csv").read_text()
    details = shared_file("ncu_stream.details.csv").read_text()
    (k,) = parse_ncu_csv(raw, details)
    assert k.name == "stream_add" and k.grid == (262144, 1, 1) and k.block == (256, 1, 1)
    m = k.metrics
    assert m.duration_ns == pytest.approx(291840.0)  # printed as 291.84 us
    assert m.elapsed_cycles == 463996.0
    assert m.dram_throughput_pct == pytest.approx(81.293309)  # from gpu__dram_throughput (no dram__throughput there)
    assert m.sectors_per_request == pytest.approx(4.0)
    assert m.threads_per_inst == 32.0
    assert m.occupancy_limiter == "warps"
    assert next(iter(m.warp_stalls)) == "long_scoreboard"  # sorted, worst first
    rules = {f.rule for f in k.findings}
    assert "SOLBottleneck" in rules and "MemoryL2Compression" not in rules  # noise dropped
    cpi = [f for f in k.findings if f.rule == "CPIStall" and f.estimated_speedup_pct is not None]
    assert cpi and cpi[0].estimated_speedup_pct == pytest.approx(18.71) and cpi[0].speedup_type == "global"


def test_launch_order_and_instances() -> None:
    profile = own_profile("tiny_launches")
    assert [k.index for k in profile.kernels] == list(range(24))
    assert all(k.name == "tiny_add" and k.grid == (1, 1, 1) and k.block == (32, 1, 1) for k in profile.kernels)
    assert all(2000 < (k.metrics.duration_ns or 0) < 5000 for k in profile.kernels)
    # details rows were kept for the first 4 launches only: the others simply have no findings
    assert profile.kernels[0].findings and not profile.kernels[10].findings


def test_live_details_page_with_raw_metric_names() -> None:
    """A live `--metrics` run prints the details page with raw names and base units ('52,160' ns)."""
    kernels = parse_ncu_csv(None, shared_file("ncu_torch_elementwise.metrics.csv").read_text())
    assert len(kernels) == 11
    assert kernels[0].metrics.duration_ns == 52160.0
    assert kernels[2].name == "vectorized_elementwise_kernel"
    assert kernels[2].metrics.memory_throughput_pct == pytest.approx(80.87)


def test_our_fixtures_carry_every_field_the_classifier_reads() -> None:
    m = own_profile("stream").kernels[0].metrics
    for field in ("duration_ns", "elapsed_cycles", "sm_throughput_pct", "memory_throughput_pct", "dram_throughput_pct",
                  "l1_throughput_pct", "l2_throughput_pct", "l1_hit_rate_pct", "l2_hit_rate_pct",
                  "achieved_occupancy_pct", "theoretical_occupancy_pct", "registers_per_thread", "waves_per_sm",
                  "sectors_per_request", "bank_conflicts", "threads_per_inst", "tensor_pipe_pct", "fma_pipe_pct",
                  "xu_pipe_pct", "ipc", "local_spill_requests", "atomic_requests"):
        assert getattr(m, field) is not None, field
    assert m.extra["device__attribute_multiprocessor_count"] == 132
    bank = own_profile("bank_conflicts").kernels[0].metrics
    assert bank.bank_conflicts_per_request > 30  # the planted 32-way conflict: 31 extra wavefronts
    assert bank.shared_mem_per_block_bytes == 4096.0  # float tile[32 * 32]
    assert bank.sectors_per_request is None  # no global loads at all: no ratio rather than a made-up one


def test_requested_metrics_avoid_sass_passes() -> None:
    names = ncu_parse.requested_metrics()
    assert len(names) == len(set(names))
    assert not [n for n in names if "__sass_" in n]
    assert "gpu__time_duration.sum" in names and "launch__occupancy_limit_registers" in names


def test_not_ncu_output_is_refused() -> None:
    with pytest.raises(NcuParseError):
        parse_ncu_csv("a,b\n1,2\n")
    with pytest.raises(NcuParseError):
        parse_ncu_csv(None, '"ID","Kernel Name"\n"0","k"\n')
    with pytest.raises(NcuParseError):
        parse_ncu_csv(None, None)


def test_fixture_folder_is_small() -> None:
    sizes = {p.name: p.stat().st_size for p in OWN.iterdir() if p.is_file()}
    assert sizes and max(sizes.values()) < 40_000, sizes
