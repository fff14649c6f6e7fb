"""profile_kernel / classify_state tool functions, the profile store, and state discovery on a real
KB file (several processes at once included)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prof_fixtures import PROBLEMS, own_profile
from pydantic import ValidationError

from kb_mcp.harness.profile_model import KernelMetrics
from kb_mcp.kb.store import KBStore
from kb_mcp.profiling.profile_store import ProfileNotFound, ProfileStore, new_profile_id
from kb_mcp.tools import classify_state, profile_kernel
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext

# A latency-bound kernel whose dominant stall (instruction-cache misses) no seed state names.
NOVEL = KernelMetrics(duration_ns=2e6, sm_throughput_pct=18.0, memory_throughput_pct=12.0, dram_throughput_pct=5.0,
                      achieved_occupancy_pct=70.0, theoretical_occupancy_pct=100.0, occupancy_limiter="warps",
                      threads_per_inst=32.0, warp_stalls={"no_instruction": 9.5, "wait": 2.0})


def _stored(ctx: ToolContext, fixture: str) -> str:
    profile = own_profile(fixture)
    profile.profile_id = new_profile_id()
    profile.total_gpu_time_ns = sum(k.metrics.duration_ns or 0 for k in profile.kernels)
    ProfileStore(ctx.profiles_dir).save(profile)
    return profile.profile_id


def test_profile_store_round_trip_and_ids(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "profiles")
    profile = own_profile("stream")
    profile.profile_id = new_profile_id()
    store.save(profile)
    assert store.load(profile.profile_id) == profile
    assert store.ids() == [profile.profile_id]
    with pytest.raises(ProfileNotFound, match="run profile_kernel first"):
        store.load(new_profile_id())
    with pytest.raises(ProfileNotFound, match="not a profile id"):
        store.load("../../kb")  # ids never become paths outside the folder
    assert not list((tmp_path / "profiles").glob(".*"))  # atomic write leaves no temp file


def test_classify_stored_profile_matches_seed_states(kb_path: Path) -> None:
    ctx = ToolContext(kb_path)
    result = classify_state.run(ctx, classify_state.Request(profile_id=_stored(ctx, "stream")))
    (kernel,) = result.kernels
    assert kernel.state_id == "memory_bandwidth_saturated" and kernel.matched_by == "signature"
    assert kernel.primary == "memory" and kernel.secondary == "dram_bandwidth"
    assert result.overall and result.overall.state_id == "memory_bandwidth_saturated"
    assert not result.kb_grew and result.new_state_ids == []
    assert "memory_bandwidth_saturated" in result.next_step


def test_whole_candidate_state_for_many_launches(kb_path: Path) -> None:
    ctx = ToolContext(kb_path)
    result = classify_state.run(ctx, classify_state.Request(profile_id=_stored(ctx, "tiny_launches")))
    assert result.overall and result.overall.state_id == "api_overhead_dominant"
    assert result.kernels[0].state_id == "insufficient_parallelism" and result.kernels[0].instances == 24
    assert "api_overhead_dominant" in result.next_step


def test_unknown_profile_is_an_actionable_error(kb_path: Path) -> None:
    with pytest.raises(ToolError, match="run profile_kernel first"):
        classify_state.run(ToolContext(kb_path), classify_state.Request(profile_id="p_00000000abcd"))


def test_request_needs_exactly_one_source() -> None:
    with pytest.raises(ValidationError):
        classify_state.Request()
    with pytest.raises(ValidationError):
        classify_state.Request(profile_id="p_00000000abcd", metrics=NOVEL)


def test_new_signature_is_discovered_once_and_reused(kb_path: Path) -> None:
    ctx = ToolContext(kb_path)
    before = {s.id for s in KBStore.open(kb_path).list_states()}
    first = classify_state.run(ctx, classify_state.Request(metrics=NOVEL, kernel_name="icache_heavy"))
    assert first.kb_grew and len(first.new_state_ids) == 1
    new_id = first.new_state_ids[0]
    assert first.overall and first.overall.state_id == new_id and first.overall.matched_by == "discovered"
    assert first.overall.primary == "latency" and first.overall.secondary is None
    assert any(e.metric == "warp_stalls.no_instruction" for e in first.overall.evidence)

    fresh = KBStore.open(kb_path)  # what another server process would read from the file
    state = fresh.get_state(new_id)
    assert state is not None and state.origin == "discovered" and state.parent_id in before
    assert fresh.candidates(new_id), "a discovered state inherits its nearest state's optimizations"

    similar = NOVEL.model_copy(update={"sm_throughput_pct": 22.0, "warp_stalls": {"no_instruction": 7.0}})
    second = classify_state.run(ToolContext(kb_path), classify_state.Request(metrics=similar))
    assert not second.kb_grew and second.overall and second.overall.state_id == new_id
    assert second.overall.matched_by == "signature"
    after = {s.id for s in KBStore.open(kb_path).list_states()}
    assert after - before == {new_id}


@pytest.mark.parametrize("metrics", [
    {"sm_throughput_pct": 20}, {"sm_throughput_pct": 15, "dram_throughput_pct": 10},
    NOVEL.model_copy(update={"dram_throughput_pct": None}).model_dump(exclude_none=True)])
def test_incomplete_metrics_never_add_a_state_to_the_shared_kb(kb_path: Path, metrics: dict) -> None:
    ctx = ToolContext(kb_path)
    before = {s.id for s in KBStore.open(kb_path).list_states()}
    result = classify_state.run(ctx, classify_state.Request(metrics=metrics))
    (kernel,) = result.kernels
    assert not result.kb_grew and result.new_state_ids == [] and kernel.state_id is None
    assert "a new state is not added from incomplete metrics" in kernel.note
    assert all(name in kernel.note for name in ("memory_throughput_pct", "dram_throughput_pct") if name not in metrics)
    assert {s.id for s in KBStore.open(kb_path).list_states()} == before


def test_dram_and_sm_throughput_alone_classify_a_bandwidth_bound_kernel(kb_path: Path) -> None:
    ctx = ToolContext(kb_path)
    before = len(KBStore.open(kb_path).list_states())
    result = classify_state.run(ctx, classify_state.Request(metrics={"dram_throughput_pct": 85,
                                                                     "sm_throughput_pct": 20}))
    (kernel,) = result.kernels
    assert kernel.state_id == "memory_bandwidth_saturated" and not result.kb_grew
    assert {(e.metric, e.value) for e in kernel.evidence} <= {("dram_throughput_pct", 85.0),
                                                               ("sm_throughput_pct", 20.0)}
    assert len(KBStore.open(kb_path).list_states()) == before


DISCOVER = """
import sys
from kb_mcp.harness.profile_model import KernelMetrics
from kb_mcp.tools import classify_state
from kb_mcp.tools.context import ToolContext
metrics = KernelMetrics.model_validate_json(sys.argv[2])
result = classify_state.run(ToolContext(sys.argv[1]), classify_state.Request(metrics=metrics))
print(result.overall.state_id, result.kb_grew)
"""


def test_concurrent_discovery_creates_exactly_one_state(kb_path: Path) -> None:
    """Eight server-like processes meet the same new signature at once: one state, created once."""
    KBStore.open(kb_path)  # seed the file first, as a running server would have
    before = len(KBStore.open(kb_path).list_states())
    procs = [subprocess.Popen([sys.executable, "-c", DISCOVER, str(kb_path), NOVEL.model_dump_json()],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-500:] for _, err in outputs]
    answers = [out.split() for out, _ in outputs]
    assert len({state for state, _ in answers}) == 1
    assert sum(grew == "True" for _, grew in answers) == 1  # exactly one process created it
    assert len(KBStore.open(kb_path).list_states()) == before + 1


def test_seed_signature_never_grows_the_kb(kb_path: Path) -> None:
    ctx = ToolContext(kb_path)
    before = len(KBStore.open(kb_path).list_states())
    for fixture in ("fma", "strided", "spills", "divergence"):
        result = classify_state.run(ctx, classify_state.Request(profile_id=_stored(ctx, fixture)))
        assert not result.kb_grew
    assert len(KBStore.open(kb_path).list_states()) == before


def test_compact_and_detailed_summaries() -> None:
    profile = own_profile("tiny_launches")
    profile.total_gpu_time_ns = sum(k.metrics.duration_ns or 0 for k in profile.kernels)
    compact, omitted = profile_kernel.summarize(profile, detail=False, top=5)
    assert len(compact) == 5 and omitted == 19
    assert [k.index for k in compact] == sorted(k.index for k in compact)  # launch order kept
    heaviest = sorted(profile.kernels, key=lambda k: -(k.metrics.duration_ns or 0))[:5]
    assert {k.index for k in compact} == {k.index for k in heaviest}
    assert all(k.metrics is None and len(k.top_stalls) <= 3 for k in compact)
    full, omitted = profile_kernel.summarize(profile, detail=True, top=5)
    assert len(full) == 24 and omitted == 0 and full[0].metrics is not None and full[0].full_name
    assert sum(k.time_share for k in full) == pytest.approx(1.0, abs=1e-3)


def test_bad_inputs_are_actionable_errors(kb_path: Path, tmp_path: Path) -> None:
    ctx = ToolContext(kb_path)
    with pytest.raises(ToolError, match="not a KernelBench problem"):
        profile_kernel.run(ctx, profile_kernel.Request(problem="import torch\nx = 1\n"))
    with pytest.raises(ToolError, match="file not found"):
        profile_kernel.run(ctx, profile_kernel.Request(problem=str(tmp_path / "missing.py")))
    with pytest.raises(ToolError, match="ModelNew"):
        profile_kernel.run(ctx, profile_kernel.Request(problem=str(PROBLEMS / "relu_mul_add.py"),
                                                       candidate="import torch\nclass Model: pass\n"))
