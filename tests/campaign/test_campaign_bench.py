"""The campaign's bench on recorded real profiles (Nsight Compute output recorded on an H100): the
GPU path of a step's diagnosis, and the lowering prompt it feeds, without a GPU here."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.campaign.agent_kernel import lower_request
from kb_mcp.campaign.bench import Bench, BenchError
from kb_mcp.harness.problem import load_problem
from kb_mcp.harness.profile_model import Profile
from kb_mcp.profiling.ncu_parse import parse_ncu_csv
from kb_mcp.profiling.profile_store import ProfileStore, new_profile_id
from kb_mcp.tools.context import ToolContext

ROOT = Path(__file__).resolve().parents[2]
NCU = ROOT / "tests" / "fixtures" / "ncu"
SWISH = ROOT / "examples" / "problems" / "swish.py"


def _stored_profile(ctx: ToolContext, name: str) -> str:
    kernels = parse_ncu_csv((NCU / f"{name}.raw.csv").read_text(), (NCU / f"{name}.details.csv").read_text())
    profile = Profile(profile_id=new_profile_id(), problem=name, kernels=kernels,
                      total_gpu_time_ns=sum(k.metrics.duration_ns or 0 for k in kernels))
    ProfileStore(ctx.profiles_dir).save(profile)
    return profile.profile_id


@pytest.mark.parametrize(("fixture", "state"), [("stream", "memory_bandwidth_saturated"),
                                                ("strided", "uncoalesced_global_access")])
def test_diagnosis_of_a_recorded_profile(kb_path: Path, fixture: str, state: str) -> None:
    ctx = ToolContext(kb_path)
    bench = Bench(ctx)
    profile_id = _stored_profile(ctx, fixture)
    diagnosis = bench.diagnose(load_problem(SWISH), "unused: the profile is reused", "c_0", compile_only=False,
                               fallback_state="high_level_inefficiency", profile_id=profile_id)
    assert diagnosis.state_source == "classified" and diagnosis.state_id == state
    assert diagnosis.profile_id == profile_id
    assert f"(id {state})" in diagnosis.state_summary and "Evidence:" in diagnosis.state_summary
    assert "DRAM" in diagnosis.profile_summary and "us (" in diagnosis.profile_summary
    offers = bench.suggest(diagnosis.state_id, k=3, temperature=0.3, exclude=[], seed=1)
    assert len(offers) == 3 and all(o.suggestion.expected_speedup for o in offers)
    prompt = lower_request(problem_name="swish", reference_source="ref", current_source="cur", current_summary="1 ms",
                           state_summary=diagnosis.state_summary, profile_summary=diagnosis.profile_summary,
                           optimization_summary=offers[0].prompt)
    assert diagnosis.profile_summary in prompt and "What to do:" in prompt and "Problem: swish" in prompt
    ctx.close()


def test_compile_only_diagnosis_falls_back_and_says_so(kb_path: Path) -> None:
    ctx = ToolContext(kb_path)
    bench = Bench(ctx)
    diagnosis = bench.diagnose(load_problem(SWISH), "", "c_0", compile_only=True,
                               fallback_state="high_level_inefficiency")
    assert diagnosis.state_source == "fallback" and diagnosis.profile_id is None
    assert "compile-only" in diagnosis.state_summary
    with pytest.raises(BenchError, match="not in the KB"):
        bench.diagnose(load_problem(SWISH), "", "c_0", compile_only=True, fallback_state="no_such_state")
    # without a configured state, the reference's structure decides and rules optimizations out
    derived = bench.diagnose(load_problem(SWISH), "", "c_0", compile_only=True, fallback_state=None)
    assert derived.state_id == "memory_bandwidth_saturated" and "elementwise" in derived.state_summary
    assert "flash_attention_tiling" in derived.ruled_out and "fuse_elementwise_chain" not in derived.ruled_out
    offers = bench.suggest(derived.state_id, k=10, temperature=5.0, exclude=derived.ruled_out, seed=1)
    assert offers and not {o.suggestion.optimization_id for o in offers} & set(derived.ruled_out)
    with pytest.raises(BenchError, match="unknown state_id"):
        bench.suggest("no_such_state", k=2, temperature=0.3, exclude=[], seed=0)
