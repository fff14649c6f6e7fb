"""Composed mode on the CPU: the reference's op set (recorded by the real op recorder, cached on disk),
the rule the guards apply with it (op recorder and kernel census), coverage, and the findings of
settings and machinery that speed up library ops (`harness.judgment.composed`, `harness.judgment.kernels`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kb_mcp.harness.baselines import ReferenceOpsCache
from kb_mcp.harness.judgment.composed import coverage_note, kept_packets
from kb_mcp.harness.judgment.kernels import (
    KernelLaunch,
    census_findings,
    classify_launches,
    coverage,
    kernel_ops,
    reclassify,
)
from kb_mcp.harness.judgment.verdict import FindingCode as C
from kb_mcp.harness.worker.integrity import IntegrityGuard
from kb_mcp.harness.worker.integrity_runtime import ProfilerEvent, launches_from_events
from kb_mcp.harness.worker.ops import OpRecorder, record_ops
from kb_mcp.harness.worker.trusted import setting_code

CENSUS = Path(__file__).parent / "data" / "census_h100.json"


class Block(nn.Module):
    """A small model: LayerNorm, a linear layer, softmax, GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(torch.softmax(self.fc(self.norm(x)), dim=-1))


def _reference_ops() -> list[str]:
    ref, x = Block().eval(), torch.randn(4, 16)
    with torch.no_grad():
        return record_ops(lambda: ref(x))


def test_reference_ops_are_recorded_at_the_recorders_level() -> None:
    ops = _reference_ops()
    # The dispatch mode sees what the dispatcher runs: native_layer_norm, not layer_norm (the spelling
    # that made an allow-list of `layer_norm` miss it); views and allocations are no compute ops.
    assert "aten::native_layer_norm" in ops and "aten::layer_norm" not in ops
    assert "aten::gelu" in ops and "aten::_softmax" in ops
    assert any(op in ops for op in ("aten::addmm", "aten::linear"))
    assert not {"aten::view", "aten::t", "aten::empty"} & set(ops)


def test_composed_recorder_keeps_the_references_ops_and_names_the_others() -> None:
    kept = _reference_ops()
    ref, x = Block().eval(), torch.randn(4, 16)
    same = OpRecorder(kept=kept)
    with torch.no_grad(), same:
        ref(x)
    assert same.banned() == []
    foreign = OpRecorder(kept=kept)
    q = torch.randn(1, 2, 4, 8)
    with torch.no_grad(), foreign:
        F.scaled_dot_product_attention(q, q, q)
        torch.baddbmm(torch.zeros(2, 4, 4), q[0], q[0].transpose(1, 2))
    names = {e.name for e in foreign.banned()}
    assert "aten::baddbmm" in names and names - {"aten::baddbmm"}  # SDPA's ops are not the reference's either
    messages = " ".join(f.message for f in foreign.findings())
    assert "which the reference never runs" in messages and "aten::native_layer_norm" in messages
    # the own-kernel reading: the same op is banned without the reference's set
    plain = OpRecorder()
    with torch.no_grad(), plain:
        ref(x)
    assert {e.name for e in plain.banned()} >= {"aten::native_layer_norm", "aten::gelu"}


def test_guard_in_composed_mode_allows_only_the_references_kernel_ops() -> None:
    data = json.loads(CENSUS.read_text())
    case = next(c for c in data["cases"] if c["name"] == "own_plus_torch")
    census = classify_launches(launches_from_events(ProfilerEvent.model_validate(e) for e in case["events"]))
    assert census.own and set(census.torch_ops) == {"aten::add", "aten::tanh"}
    guard = IntegrityGuard(composed=True)
    guard.compose(["aten::add", "aten::tanh"], None)  # no census-level set: the dispatch-level one stands in
    kept = guard.take_census(census)
    assert kept.torch_ops == [] and kept.own == census.own
    assert [f.code for f in census_findings(kept)] == []
    # the census worker's own record of the reference's kernel-launching ops decides at its level
    assert guard.take_census(census, ["aten::add"]).torch_ops == ["aten::tanh"]
    own_mode = IntegrityGuard()
    assert own_mode.take_census(census).torch_ops == census.torch_ops


def test_composed_mode_still_needs_a_kernel_of_its_own() -> None:
    data = json.loads(CENSUS.read_text())
    case = next(c for c in data["cases"] if c["name"] == "torch_softmax")
    census = classify_launches(launches_from_events(ProfilerEvent.model_validate(e) for e in case["events"]))
    kept = reclassify(census, kept_packets(kernel_ops(census)))
    assert kept.torch_ops == [] and kept.own == []
    assert [f.code for f in census_findings(kept)] == [C.no_custom_kernel]


def _event(name: str, cid: int, linked: int = 0, device: str = "cuda", ns: int = 0) -> ProfilerEvent:
    return ProfilerEvent(name=name, device=device, correlation_id=cid, linked_correlation_id=linked, duration_ns=ns)


def test_coverage_is_the_share_of_device_time_in_own_kernels() -> None:
    events = [
        _event("aten::addmm", 7, device="cpu"),
        _event("sm90_xmma_gemm_f32f32_tf32f32", 70, linked=7, ns=600),  # launched by aten::addmm
        _event("gelu", 71, ns=300),  # the candidate's own
        _event("Memset (Device)", 72, ns=100),
    ]
    census = classify_launches(launches_from_events(events))
    assert census.own == ["gelu"] and census.torch_ops == ["aten::addmm"]
    assert coverage(census) == 0.3
    assert coverage(classify_launches([KernelLaunch(name="gelu")])) is None  # no durations: not measured
    assert coverage(census.model_copy(update={"available": False})) is None
    assert coverage_note(0.3) == "composed mode: 30% of its GPU time in its own kernels"


def test_graph_replay_of_library_kernels_is_a_finding_of_its_own() -> None:
    launches = [KernelLaunch(name="copy", ns=5), KernelLaunch(name="sm90_xmma_gemm_f32f32", ns=50),
                KernelLaunch(name="void at::native::vectorized_elementwise_kernel<4>", ns=5)]
    replayed = classify_launches(launches, graph_launches=1)
    codes = [f.code for f in census_findings(replayed)]
    assert C.graph_replay in codes
    # a graph of the candidate's own kernels alone is no finding; nor library kernels without a graph
    assert C.graph_replay not in [f.code for f in census_findings(classify_launches(launches[:1], graph_launches=1))]
    assert C.graph_replay not in [f.code for f in census_findings(classify_launches(launches))]


def test_inductor_kernels_are_never_the_candidates_own() -> None:
    census = classify_launches([KernelLaunch(name="triton_poi_fused_gelu_0"), KernelLaunch(name="gelu")])
    assert census.own == ["gelu"] and census.library == ["triton_poi_fused_gelu_0"]
    assert C.library_call in [f.code for f in census_findings(census)]


@pytest.mark.parametrize(("key", "code"), [
    ("torch.backends.cuda.matmul.allow_tf32", C.tf32_switch),
    ("torch.backends.cudnn.allow_tf32", C.tf32_switch),
    ("torch.get_float32_matmul_precision()", C.tf32_switch),
    ("torch.backends.cudnn.benchmark", C.cudnn_benchmark),
    ("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction", C.precision_lowered),
    ("torch.get_default_dtype()", C.precision_lowered),
    ("torch.backends.cudnn.enabled", C.harness_tampering),
])
def test_changed_settings_get_their_own_codes(key: str, code: C) -> None:
    assert setting_code(key) == code


def test_cudnn_benchmark_switched_on_is_seen_by_the_snapshot() -> None:
    from kb_mcp.harness.worker.integrity_runtime import TrustedSnapshot

    pristine = TrustedSnapshot.capture()
    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = not before
        assert [f.code for f in pristine.verify()] == [C.cudnn_benchmark]
    finally:
        torch.backends.cudnn.benchmark = before


def test_reference_ops_cache_keeps_both_levels(tmp_path: Path) -> None:
    cache = ReferenceOpsCache(tmp_path)
    assert cache.get("h", "NVIDIA H200", "2.13.0") is None
    cache.add("h", "NVIDIA H200", "2.13.0", dispatch=["aten::gelu", "aten::addmm", "aten::gelu"])
    held = cache.add("h", "NVIDIA H200", "2.13.0", kernels=["aten::addmm"])
    assert held.dispatch == ["aten::addmm", "aten::gelu"] and held.kernels == ["aten::addmm"]
    assert cache.get("h", "NVIDIA H200", "2.13.0") == held
    assert cache.get("h", "NVIDIA H200", "2.13.0", track="tf32") is None  # each track its own
    cache.path("h", "NVIDIA H200", "2.13.0").write_text("{not json")
    assert cache.get("h", "NVIDIA H200", "2.13.0") is None
    assert kept_packets(["aten::addmm", "prims::convert_element_type"]) == {"addmm", "convert_element_type"}
