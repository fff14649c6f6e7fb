"""suggest_optimizations and record_outcome against a real KB file: what comes back, what moves a
score (only the stored verdict), idempotency, and the errors an agent can act on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from kb_mcp.kb.models import ALL_ARCH, CandidateRecord, Verdict
from kb_mcp.policy.credit import EAGER_CAP, MIN_WEIGHT, PEER_ALLOWANCE
from kb_mcp.tools import record_outcome as ro
from kb_mcp.tools import suggest_optimizations as so
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext

STATE = "memory_bandwidth_saturated"
OPT = "fuse_elementwise_chain"


@pytest.fixture
def ctx(kb_path: Path) -> ToolContext:
    return ToolContext(kb_path, client_name="test-agent")


def _store_candidate(ctx: ToolContext, cid: str, *, verdict: Verdict = Verdict.faster, time_ms: float | None = 1.0,
                     eager_ms: float | None = 2.0, problem_hash: str = "h1", flagged: bool = False, arch: str = "sm_90",
                     device: str = "NVIDIA H100 80GB HBM3") -> None:
    with ctx.store.transaction() as tx:
        tx.put_candidate(CandidateRecord(candidate_id=cid, problem="p", problem_hash=problem_hash, verdict=verdict,
                                         arch=arch, device=device, time_ms=time_ms, eager_ms=eager_ms, flagged=flagged))


def _record(ctx: ToolContext, cid: str, **kw: object) -> ro.Result:
    args = {"state_id": STATE, "optimization_id": OPT, "candidate_id": cid, **kw}
    return ro.run(ctx, ro.Request.model_validate(args))


# ---- suggest_optimizations --------------------------------------------------------------------------


def test_suggest_returns_k_distinct_actionable_entries(ctx: ToolContext) -> None:
    res = so.run(ctx, so.Request(state_id=STATE, k=4, arch="9.0", seed=1))
    assert res.arch == "hopper" and res.bottleneck == "memory/dram_bandwidth"
    ids = [s.id for s in res.suggestions]
    assert len(ids) == len(set(ids)) == 4
    applicable = {sc.optimization_id for sc in ctx.store.candidates(STATE)}
    assert set(ids) <= applicable and res.candidates == len(applicable)
    for s in res.suggestions:
        assert len(s.what_to_do) > 80 and s.why_it_fits and s.cost
        assert s.expected_speedup > 0 and s.confidence == 0.0 and s.samples == 0
        assert s.scored_on == ALL_ARCH
        assert all(":" in f for f in s.follow_ups)
    assert len(res.model_dump_json()) < 12_000, "a suggestion result must stay small"


def test_suggest_seed_exclude_and_greedy(ctx: ToolContext) -> None:
    a = so.run(ctx, so.Request(state_id=STATE, k=3, seed=9))
    b = so.run(ctx, so.Request(state_id=STATE, k=3, seed=9))
    assert [s.id for s in a.suggestions] == [s.id for s in b.suggestions]
    top = so.run(ctx, so.Request(state_id=STATE, k=1, temperature=0.0)).suggestions[0]
    assert top.id == "flash_attention_tiling"  # the highest prior in this state
    rest = so.run(ctx, so.Request(state_id=STATE, k=3, temperature=0.0, exclude=[top.id]))
    assert top.id not in [s.id for s in rest.suggestions]


def test_suggest_offers_compensated_fp32_for_idle_tensor_cores_in_the_fp32_track(ctx: ToolContext) -> None:
    res = so.run(ctx, so.Request(state_id="tensor_cores_idle", k=10, arch="sm_90", track="fp32", temperature=0.0))
    [offered] = [s for s in res.suggestions if s.id == "compensated_fp32_tensor_cores"]
    assert "hi = tf32(x)" in offered.what_to_do and offered.expected_speedup > 1.0
    assert len(offered.lessons) == 2 and all(x.source == "seed" for x in offered.lessons)
    assert any("lo*hi' + hi*lo' + hi*hi'" in x.text for x in offered.lessons)
    assert "fp32 track" in offered.why_it_fits
    mma = next(s for s in res.suggestions if s.id == "use_tensor_cores_mma")
    assert "compensated_fp32_tensor_cores: Strict-FP32 matmul on tensor cores" in " ".join(mma.follow_ups)


def test_suggest_errors_are_actionable(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="memory_bandwidth_saturated"):
        so.run(ctx, so.Request(state_id="memory_bandwith_saturated"))
    with pytest.raises(ToolError, match="sm_90"):
        so.run(ctx, so.Request(state_id=STATE, arch="pentium"))
    with pytest.raises(ValidationError):
        so.Request(state_id=STATE, k=0)


def test_suggest_uses_measured_per_arch_scores(ctx: ToolContext) -> None:
    for i in range(6):
        _store_candidate(ctx, f"c_{i}", time_ms=0.5, eager_ms=2.0)  # 4x over eager
        _record(ctx, f"c_{i}")
    res = so.run(ctx, so.Request(state_id=STATE, k=1, temperature=0.0, arch="sm_90"))
    top = res.suggestions[0]
    assert top.id == OPT and top.scored_on == "hopper" and top.samples == 6
    # six consistent 4x measurements outweigh the 1.3x prior: the estimate sits just below 4x
    assert 3.0 < top.expected_speedup < 4.0 and top.confidence > 0.5
    assert "6 of 6 attempts were faster" in top.why_it_fits
    other_arch = so.run(ctx, so.Request(state_id=STATE, k=1, temperature=0.0, arch="sm_80"))
    assert other_arch.suggestions[0].scored_on == ALL_ARCH  # no ampere data: pooled score stands in


def test_a_score_with_neither_measurements_nor_a_prior_that_counts_is_suggested_with_no_confidence(
        ctx: ToolContext) -> None:
    # a retired prior (its truth changed) whose measurements a merge took out: nothing rests on anything
    with ctx.store.transaction() as tx:
        score = tx.get_score(STATE, OPT, ALL_ARCH)
        assert score is not None
        tx.put_score(score.model_copy(update={"prior_weight": 0.0}))
    others = [sc.optimization_id for sc in ctx.store.candidates(STATE) if sc.optimization_id != OPT]
    res = so.run(ctx, so.Request(state_id=STATE, k=1, seed=3, exclude=others))
    (retired,) = res.suggestions
    assert retired.id == OPT and retired.confidence == 0.0 and retired.samples == 0


# ---- record_outcome ----------------------------------------------------------------------------------


def test_a_state_without_measurements_reads_its_priors_by_the_tracks_calibration(ctx: ToolContext) -> None:
    """Where every other state's measurements ranked optimizations against their priors, a state
    measured nowhere yet reads its own priors the right way round: the tool's selection uses the
    track's calibration, not the priors as they stand."""
    with ctx.store.transaction() as tx:
        for state in tx.state_ids():
            for score in tx.candidates(state) if state != STATE else ():
                measured = 0.1 - score.prior_mean_log_speedup
                tx.put_score(score.model_copy(update={
                    "mean_log_speedup": measured, "m2_log_speedup": 0.05, "samples": 6, "attempts": 6, "weight": 6.0,
                    "ok_weight": 6.0, "clients": {"": [6.0, measured, 0.05]}, "prior": False,
                }))
    priors = {s.optimization_id: s.prior_mean_log_speedup for s in ctx.store.candidates(STATE)}
    assert len(set(priors.values())) > 1
    first = so.run(ctx, so.Request(state_id=STATE, k=1, temperature=0)).suggestions[0].id
    assert priors[first] == min(priors.values())


def test_record_moves_scores_only_from_the_stored_verdict(ctx: ToolContext) -> None:
    _store_candidate(ctx, "c_a", time_ms=1.0, eager_ms=3.0)
    res = _record(ctx, "c_a", analysis="fused three kernels", tokens=120)
    assert res.recorded and res.score_moved and res.speedup == pytest.approx(3.0) and res.speedup_basis == "eager"
    assert res.entry.arch == "hopper" and res.entry.samples == 1 and res.entry.successes == 1
    pooled = ctx.store.get_score(STATE, OPT, ALL_ARCH)
    assert pooled is not None and pooled.samples == 1 and pooled.mean_log_speedup == pytest.approx(math.log(3.0))
    out = ctx.store.get_outcome(res.outcome_id)
    assert out is not None and out.agent == "test-agent" and out.tokens == 120 and out.analysis == "fused three kernels"
    # the request has no way to carry a speedup
    assert "speedup" not in ro.Request.model_fields
    with pytest.raises(ValidationError):
        ro.Request.model_validate({"state_id": STATE, "optimization_id": OPT, "candidate_id": "c_a", "speedup": 50.0})


def test_record_is_idempotent_per_candidate_and_optimization(ctx: ToolContext) -> None:
    _store_candidate(ctx, "c_i")
    first = _record(ctx, "c_i")
    before = ctx.store.snapshot()
    again = _record(ctx, "c_i", analysis="second try")
    assert not again.recorded and not again.score_moved and again.outcome_id == first.outcome_id
    assert again.entry.samples == 1
    assert ctx.store.snapshot() == before
    # the same candidate's credit is held by its first outcome: another optimization is refused
    with pytest.raises(ToolError, match="already credits optimization"):
        _record(ctx, "c_i", optimization_id="vectorize_global_access")
    assert ctx.store.snapshot() == before


def test_unknown_candidate_changes_nothing(ctx: ToolContext) -> None:
    before = ctx.store.snapshot()
    with pytest.raises(ToolError, match="compile_and_verify"):
        _record(ctx, "c_never_verified")
    with pytest.raises(ToolError, match="unknown optimization_id"):
        _store_candidate(ctx, "c_k")
        _record(ctx, "c_k", optimization_id="fuse_elementwise_chian")
    after = ctx.store.snapshot()
    assert after["outcomes"] == before["outcomes"] and after["scores"] == before["scores"]


def test_speedup_is_over_the_parent_of_the_same_problem(ctx: ToolContext) -> None:
    _store_candidate(ctx, "c_parent", time_ms=2.0, eager_ms=4.0)
    _store_candidate(ctx, "c_child", time_ms=0.5, eager_ms=4.0)
    _store_candidate(ctx, "c_child2", time_ms=0.5, eager_ms=4.0)
    _store_candidate(ctx, "c_foreign", time_ms=0.1, eager_ms=1.0, problem_hash="other")
    res = _record(ctx, "c_child", parent_candidate_id="c_parent")
    assert res.speedup == pytest.approx(4.0) and res.speedup_basis == "parent"
    res2 = _record(ctx, "c_child2", parent_candidate_id="c_foreign")
    assert res2.speedup == pytest.approx(8.0) and res2.speedup_basis == "eager" and "parent" in res2.note


def test_a_parent_must_have_come_first_on_the_same_gpu(ctx: ToolContext) -> None:
    _store_candidate(ctx, "c_child", time_ms=1.0, eager_ms=3.0)
    _store_candidate(ctx, "c_child2", time_ms=1.0, eager_ms=3.0)
    _store_candidate(ctx, "c_later", time_ms=6.0, eager_ms=3.0)  # verified after the children
    _store_candidate(ctx, "c_other_gpu", time_ms=6.0, eager_ms=3.0, device="NVIDIA A100-SXM4-80GB")
    res = _record(ctx, "c_child", parent_candidate_id="c_later")
    assert res.speedup_basis == "eager" and res.speedup == pytest.approx(3.0) and "after this candidate" in res.note
    res = _record(ctx, "c_child2", parent_candidate_id="c_other_gpu")
    assert res.speedup_basis == "eager" and "same GPU" in res.note


def test_a_slow_first_kernel_is_credited_with_its_real_gain(ctx: ToolContext) -> None:
    """A first kernel 3x slower than eager, taken to 1.5x slower: a real 2x gain, credited as one (the
    rule before counted the parent as the reference and credited a loss, 0.67x)."""
    _store_candidate(ctx, "c_first", time_ms=6.0, eager_ms=2.0, verdict=Verdict.slower)
    _store_candidate(ctx, "c_next", time_ms=3.0, eager_ms=2.0, verdict=Verdict.slower)
    before = ctx.store.get_score(STATE, OPT, ALL_ARCH)
    res = _record(ctx, "c_next", parent_candidate_id="c_first")
    assert res.speedup == pytest.approx(2.0) and res.speedup_basis == "parent" and res.credit_weight == 1.0
    entry = ctx.store.get_score(STATE, OPT, "hopper")
    assert entry is not None and entry.samples == 1 and entry.successes == 1 and entry.mean_log_speedup > 0
    after = ctx.store.get_score(STATE, OPT, ALL_ARCH)
    assert before is not None and after is not None
    assert after.posterior_mean_log_speedup > before.posterior_mean_log_speedup, "a gain lifts the estimate"
    outcome = ctx.store.get_outcome(res.outcome_id)
    assert outcome is not None and outcome.speedup == pytest.approx(2.0) and outcome.parent_candidate_id == "c_first"
    # the same step through the rule before: a loss
    _store_candidate(ctx, "c_first2", time_ms=6.0, eager_ms=2.0, verdict=Verdict.slower)
    _store_candidate(ctx, "c_next2", time_ms=3.0, eager_ms=2.0, verdict=Verdict.slower)
    old = ro.run(ctx, ro.Request(state_id=STATE, optimization_id="vectorize_global_access", candidate_id="c_next2",
                                 parent_candidate_id="c_first2"), rule=EAGER_CAP)
    assert old.speedup == pytest.approx(2.0 / 3.0, abs=1e-4) and old.speedup_basis == "parent_capped"


def test_a_deliberately_slow_parent_buys_little(ctx: ToolContext) -> None:
    """A verified parent 250x slower than the reference, then an ordinary candidate: the measured 500x is
    kept, but the outcome weighs a twentieth of one, and what it claims beyond its 2x over the
    reference counts only a little above the score's estimate."""
    _store_candidate(ctx, "c_slow", time_ms=500.0, eager_ms=2.0, verdict=Verdict.slower)
    _store_candidate(ctx, "c_fast", time_ms=1.0, eager_ms=2.0)
    before = ctx.store.get_score(STATE, OPT, ALL_ARCH)
    res = _record(ctx, "c_fast", parent_candidate_id="c_slow")
    assert res.speedup == pytest.approx(500.0) and res.speedup_basis == "parent" and res.score_moved
    assert res.credit_weight == pytest.approx(MIN_WEIGHT) and "250x slower than the problem's reference" in res.note
    entry = ctx.store.get_score(STATE, OPT, ALL_ARCH)
    assert before is not None and entry is not None and entry.weight == pytest.approx(MIN_WEIGHT)
    assert entry.posterior_mean_log_speedup - before.posterior_mean_log_speedup < 0.05
    # a parent faster than the reference is the basis, as named and in full
    _store_candidate(ctx, "c_mid", time_ms=1.5, eager_ms=2.0)
    _store_candidate(ctx, "c_faster", time_ms=0.5, eager_ms=2.0)
    res = _record(ctx, "c_faster", parent_candidate_id="c_mid")
    assert res.speedup == pytest.approx(3.0) and res.speedup_basis == "parent" and res.credit_weight == 1.0


def test_recorded_steps_lend_a_start_no_more_slowness_than_its_root_had(ctx: ToolContext) -> None:
    # a lineage from a first kernel 3x slower: improved to 2x slower, then a regression kept at 6x
    _store_candidate(ctx, "c_root", time_ms=6.0, eager_ms=2.0, verdict=Verdict.slower)
    for cid, parent, ms, opt in (("c_a", "c_root", 4.0, "vectorize_global_access"),
                                 ("c_b", "c_a", 12.0, "grid_stride_ilp")):
        _store_candidate(ctx, cid, time_ms=ms, eager_ms=2.0, verdict=Verdict.slower)
        _record(ctx, cid, optimization_id=opt, parent_candidate_id=parent)
    _store_candidate(ctx, "c_after", time_ms=3.0, eager_ms=2.0, verdict=Verdict.slower)
    res = _record(ctx, "c_after", parent_candidate_id="c_b")
    assert res.speedup_basis == "lineage_best" and res.speedup == pytest.approx(4.0 / 3.0, abs=1e-4)
    # a lineage recorded from the reference itself, then slowed down on purpose: the reference is its start
    _store_candidate(ctx, "c_ref_child", time_ms=2.0, eager_ms=2.0)
    _record(ctx, "c_ref_child", optimization_id="grid_stride_ilp")
    _store_candidate(ctx, "c_slowed", time_ms=40.0, eager_ms=2.0, verdict=Verdict.slower)
    _record(ctx, "c_slowed", optimization_id="vectorize_global_access", parent_candidate_id="c_ref_child")
    _store_candidate(ctx, "c_back", time_ms=2.0, eager_ms=2.0, verdict=Verdict.slower)
    res = _record(ctx, "c_back", parent_candidate_id="c_slowed")
    assert res.speedup_basis == "parent_capped" and res.speedup == pytest.approx(1.0) and res.credit_weight == 1.0


def test_a_first_kernel_far_slower_than_other_clients_first_kernels_weighs_less(kb_path: Path) -> None:
    honest, other = ToolContext(kb_path, client_name="honest"), ToolContext(kb_path, client_name="mallory")
    _store_candidate(honest, "c_h_root", time_ms=3.0, eager_ms=2.0, verdict=Verdict.slower)  # 1.5x
    _store_candidate(honest, "c_h_next", time_ms=2.5, eager_ms=2.0, verdict=Verdict.slower)
    _record(honest, "c_h_next", parent_candidate_id="c_h_root")
    # 8x is within the allowance for a problem nobody else started, not next to others' 1.5x
    _store_candidate(other, "c_m_root", time_ms=16.0, eager_ms=2.0, verdict=Verdict.slower)
    _store_candidate(other, "c_m_next", time_ms=2.0, eager_ms=2.0, verdict=Verdict.slower)
    res = _record(other, "c_m_next", optimization_id="vectorize_global_access", parent_candidate_id="c_m_root")
    assert res.speedup == pytest.approx(8.0) and res.credit_weight == pytest.approx(PEER_ALLOWANCE * 1.5 / 8.0)
    assert "other clients" in res.note
    # the client's own first kernels are not its peers: the same record from the honest client, whose
    # only first kernel is its own, weighs in full
    _store_candidate(honest, "c_h_root2", time_ms=16.0, eager_ms=2.0, problem_hash="h2", verdict=Verdict.slower)
    _store_candidate(honest, "c_h_next2", time_ms=2.0, eager_ms=2.0, problem_hash="h2", verdict=Verdict.slower)
    res = _record(honest, "c_h_next2", optimization_id="vectorize_global_access", parent_candidate_id="c_h_root2")
    assert res.credit_weight == 1.0


def test_one_extreme_outcome_moves_a_score_a_bounded_amount(ctx: ToolContext) -> None:
    for i in range(5):
        _store_candidate(ctx, f"c_{i}", time_ms=2.0 / 1.3, eager_ms=2.0)
        _record(ctx, f"c_{i}")
    before = ctx.store.get_score(STATE, OPT, ALL_ARCH)
    _store_candidate(ctx, "c_huge", time_ms=0.001, eager_ms=2.0)  # 2000x over eager, not flagged
    res = _record(ctx, "c_huge", optimization_id=OPT)
    after = ctx.store.get_score(STATE, OPT, ALL_ARCH)
    assert before is not None and after is not None and res.speedup == pytest.approx(2000.0)
    assert "moves a score only so far" in res.note
    assert after.mean_log_speedup - before.mean_log_speedup < 0.25


def test_flagged_and_failed_verdicts(ctx: ToolContext) -> None:
    _store_candidate(ctx, "c_flag", time_ms=0.001, eager_ms=2.0, flagged=True)
    res = _record(ctx, "c_flag")
    assert res.recorded and not res.score_moved and "flagged" in res.note
    out = ctx.store.get_outcome(res.outcome_id)
    assert out is not None and out.flagged and out.speedup == pytest.approx(2000.0)  # kept in the replay buffer
    assert ctx.store.get_score(STATE, OPT, "hopper") is None
    assert ctx.store.get_score(STATE, OPT, ALL_ARCH).prior  # type: ignore[union-attr]

    with ctx.store.transaction() as tx:  # a valid verdict whose processes tried to reach the network
        tx.put_candidate(CandidateRecord(candidate_id="c_tried", problem="p", problem_hash="h1", verdict=Verdict.faster,
                                         arch="sm_90", device="NVIDIA H100 80GB HBM3", time_ms=1.0, eager_ms=2.0,
                                         flagged=True, findings=["sandbox_attempt"],
                                         attempt="the candidate tried what the sandbox refuses: network: connect "
                                                 "1.1.1.1:443 (worker)."))
    res = _record(ctx, "c_tried")
    assert res.recorded and not res.score_moved
    assert "flagged for review (sandbox_attempt)" in res.note and "connect 1.1.1.1:443" in res.note, res.note
    assert "implausible" not in res.note

    _store_candidate(ctx, "c_ce", verdict=Verdict.compile_error, time_ms=None, eager_ms=None)
    res = _record(ctx, "c_ce")
    assert res.score_moved and res.speedup is None
    assert (res.entry.attempts, res.entry.samples, res.entry.compile_failures) == (1, 0, 1)

    _store_candidate(ctx, "c_ng", verdict=Verdict.needs_gpu, time_ms=None, eager_ms=None, arch="")
    res = _record(ctx, "c_ng")
    assert res.recorded and not res.score_moved


def test_new_optimization_transition_and_lesson(ctx: ToolContext) -> None:
    _store_candidate(ctx, "c_n", time_ms=1.0, eager_ms=1.5)
    res = _record(
        ctx, "c_n", optimization_id=None,
        new_optimization={"name": "Cache row max in registers",
                          "description": "Keep the running row maximum in a register across the tile loop instead of "
                                         "re-reading it from shared memory."},
        next_state_id="compute_throughput_saturated",
        lesson="Register-cached maxima remove one shared load per element.",
    )
    assert res.optimization_created and res.optimization_id == "agent_cache_row_max_in_registers"
    opt = ctx.store.get_optimization(res.optimization_id)
    assert opt is not None and opt.origin == "agent" and opt.applicable_states == [STATE]
    (tr,) = ctx.store.transitions(STATE)
    assert (tr.optimization_id, tr.next_state_id, tr.count) == (res.optimization_id, "compute_throughput_saturated", 1)
    (lesson,) = ctx.store.lessons(STATE, res.optimization_id)
    assert lesson.author == "test-agent" and lesson.candidate_id == "c_n" and lesson.source == "agent"
    # the same name again is the same optimization, with more evidence
    _store_candidate(ctx, "c_n2", time_ms=1.0, eager_ms=1.2)
    res2 = _record(ctx, "c_n2", optimization_id=None,
                   new_optimization={"name": "Cache row max in registers",
                                     "description": "another wording of the same change, long enough"})
    assert not res2.optimization_created and res2.entry.samples == 2
    # the new optimization is now a candidate in this state, with its measured score
    others = [sc.optimization_id for sc in ctx.store.candidates(STATE,
                                                                "hopper") if sc.optimization_id != res.optimization_id]
    only = so.run(ctx, so.Request(state_id=STATE, k=3, arch="hopper", exclude=others)).suggestions
    assert [s.id for s in only] == [res.optimization_id] and only[0].samples == 2
    with pytest.raises(ValidationError):
        ro.Request(state_id=STATE, candidate_id="c_n")
    with pytest.raises(ToolError, match="next_state_id"):
        _store_candidate(ctx, "c_n3")
        _record(ctx, "c_n3", next_state_id="nowhere")


def test_results_serialize_for_mcp(ctx: ToolContext) -> None:
    _store_candidate(ctx, "c_s")
    res = _record(ctx, "c_s")
    assert json.loads(res.model_dump_json())["entry"]["optimization_id"] == OPT
    assert ro.Request.model_json_schema()["properties"]["candidate_id"]["description"]
    assert so.NAME == "suggest_optimizations" and ro.NAME == "record_outcome"
