"""A kernel's lineage read from the KB (what was applied on the way to it), and phase ordering (where
an optimization led before, and what that is worth), on a real KB file through the real tools."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.kb.models import CandidateRecord, Outcome, Verdict
from kb_mcp.policy import phase
from kb_mcp.policy.lineage import first_kernels, lineage_optimizations, start_of
from kb_mcp.tools import record_outcome as ro
from kb_mcp.tools import suggest_optimizations as so
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext

HLI, MBS = "high_level_inefficiency", "memory_bandwidth_saturated"


@pytest.fixture
def ctx(kb_path: Path) -> ToolContext:
    return ToolContext(kb_path, client_name="agent")


def _step(ctx: ToolContext, cid: str, opt: str, parent: str | None, *, state: str = HLI, time_ms: float = 1.0,
          next_state: str | None = None, verdict: Verdict = Verdict.faster) -> ro.Result:
    with ctx.store.transaction() as tx:
        tx.put_candidate(CandidateRecord(candidate_id=cid, problem="p", problem_hash="h", verdict=verdict, arch="sm_90",
                                         device="H100", time_ms=time_ms, eager_ms=2.0))
    return ro.run(ctx, ro.Request(state_id=state, optimization_id=opt, candidate_id=cid, parent_candidate_id=parent,
                                  next_state_id=next_state))


def test_the_lineage_is_every_optimization_on_the_way_to_the_kernel(ctx: ToolContext) -> None:
    _step(ctx, "c_1", "fuse_elementwise_chain", None, time_ms=1.5)
    _step(ctx, "c_2", "vectorize_global_access", "c_1", time_ms=1.2)
    _step(ctx, "c_3", "grid_stride_ilp", "c_2", time_ms=1.0)
    _step(ctx, "c_side", "shared_memory_tiling", "c_1", time_ms=1.4)  # a sibling branch, not an ancestor
    with ctx.store.read() as view:
        assert lineage_optimizations(view, "c_3") == ["grid_stride_ilp", "vectorize_global_access",
                                                      "fuse_elementwise_chain"]
        assert lineage_optimizations(view, "c_side") == ["shared_memory_tiling", "fuse_elementwise_chain"]
        assert lineage_optimizations(view, "c_unknown") == []


def test_a_forged_cycle_of_parents_ends_the_walk(ctx: ToolContext) -> None:
    with ctx.store.transaction() as tx:
        for cid, parent, opt in (("c_a", "c_b", "grid_stride_ilp"), ("c_b", "c_a", "fuse_elementwise_chain")):
            tx.put_outcome(Outcome(id=f"out_{cid}", problem="p", candidate_id=cid, parent_candidate_id=parent,
                                   state_id=HLI, optimization_id=opt, arch="hopper", verdict=Verdict.faster))
    with ctx.store.read() as view:
        assert sorted(lineage_optimizations(view, "c_a")) == ["fuse_elementwise_chain", "grid_stride_ilp"]


def test_outcomes_recorded_by_a_client_that_did_not_verify_the_candidate_are_no_part_of_its_lineage(
        ctx: ToolContext) -> None:
    """Records another client wrote of a candidate (in a KB file written before record_outcome refused
    them) neither exclude suggestions nor move where its lineage starts."""
    with ctx.store.transaction() as tx:
        for cid, time_ms in (("c_root", 1.6), ("c_mine", 1.0)):
            tx.put_candidate(CandidateRecord(candidate_id=cid, problem="p", problem_hash="h", verdict=Verdict.slower,
                                             arch="sm_90", device="H100", time_ms=time_ms, eager_ms=2.0,
                                             verified_by=["agent"]))
        for opt, agent, parent in (("fuse_elementwise_chain", "squatter", "c_root"),
                                   ("online_softmax", "agent", None)):
            tx.put_outcome(Outcome(id=f"out_{opt}", problem="p", candidate_id="c_mine", parent_candidate_id=parent,
                                   state_id=HLI, optimization_id=opt, arch="hopper", verdict=Verdict.slower,
                                   agent=agent))
    with ctx.store.read() as view:
        assert lineage_optimizations(view, "c_mine") == ["online_softmax"]
        mine = view.get_candidate("c_mine")
        assert mine is not None
        start = start_of(view, mine, "agent")
    assert (start.root_ms, start.best_ms) == (2.0, 1.0)  # from the reference, as its verifier recorded
    res = so.run(ctx, so.Request(state_id=HLI, k=10, candidate_id="c_mine"))
    assert res.lineage_excluded == ["online_softmax"]


def _verified(ctx: ToolContext, cid: str, time_ms: float, *, problem_hash: str = "h") -> CandidateRecord:
    rec = CandidateRecord(candidate_id=cid, problem="p", problem_hash=problem_hash, verdict=Verdict.slower,
                          arch="sm_90", device="H100", time_ms=time_ms, eager_ms=2.0)
    with ctx.store.transaction() as tx:
        tx.put_candidate(rec)
    return rec


def test_the_start_of_a_lineage_is_its_first_kernel_and_its_best_the_fastest_on_the_way(ctx: ToolContext) -> None:
    _verified(ctx, "c_root", 6.0)  # the first kernel: 3x slower than the reference, no outcome made it
    _step(ctx, "c_1", "fuse_elementwise_chain", "c_root", time_ms=4.0)
    _step(ctx, "c_2", "vectorize_global_access", "c_1", time_ms=12.0)  # a regression the agent kept
    with ctx.store.read() as view:
        parent = view.get_candidate("c_2")
        assert parent is not None
        start = start_of(view, parent, "agent")
    assert (start.parent_ms, start.best_ms, start.root_ms, start.root_eager_ms) == (12.0, 4.0, 6.0, 2.0)
    assert start.root_slowness == 3.0 and start.peers == ()
    # a lineage recorded from the reference: the reference is its start
    _step(ctx, "c_r1", "fuse_elementwise_chain", None, time_ms=10.0)
    with ctx.store.read() as view:
        parent = view.get_candidate("c_r1")
        assert parent is not None
        from_reference = start_of(view, parent, "agent")
    assert from_reference.root_slowness == 1.0 and from_reference.best_ms == 2.0
    # the first kernel is a peer's for every other client, never for its own
    with ctx.store.read() as view:
        assert first_kernels(view, "h", "someone else") == (3.0,)
        assert first_kernels(view, "h", "agent") == ()


def test_a_forged_cycle_or_an_unverified_ancestor_ends_the_walk_at_the_last_kernel_reached(ctx: ToolContext) -> None:
    for cid, parent in (("c_x", "c_y"), ("c_y", "c_x")):
        _verified(ctx, cid, 8.0)
        with ctx.store.transaction() as tx:
            tx.put_outcome(Outcome(id=f"out_{cid}", problem="p", candidate_id=cid, parent_candidate_id=parent,
                                   state_id=HLI, optimization_id="grid_stride_ilp", arch="hopper",
                                   verdict=Verdict.slower, agent="agent"))
    _verified(ctx, "c_z", 5.0)
    with ctx.store.transaction() as tx:
        tx.put_outcome(Outcome(id="out_c_z", problem="p", candidate_id="c_z", parent_candidate_id="c_never_verified",
                               state_id=HLI, optimization_id="grid_stride_ilp", arch="hopper", verdict=Verdict.slower))
    with ctx.store.read() as view:
        x, z = view.get_candidate("c_x"), view.get_candidate("c_z")
        assert x is not None and z is not None
        cycle, orphan = start_of(view, x, "agent"), start_of(view, z, "agent")
    assert cycle.root_ms == 8.0 and cycle.best_ms == 8.0
    assert (orphan.root_ms, orphan.root_slowness) == (5.0, 2.5)


def test_suggest_leaves_out_what_the_lineage_applied(ctx: ToolContext) -> None:
    applied = ["flash_attention_tiling", "fuse_elementwise_chain"]  # the two best priors in this state
    _step(ctx, "c_1", applied[1], None, time_ms=1.5)
    _step(ctx, "c_2", applied[0], "c_1", time_ms=1.2)
    res = so.run(ctx, so.Request(state_id=HLI, candidate_id="c_2", k=10, temperature=0.0))
    assert res.lineage_excluded == applied
    assert not {s.id for s in res.suggestions} & set(applied)
    without = so.run(ctx, so.Request(state_id=HLI, k=2, temperature=0.0))
    assert [s.id for s in without.suggestions] == applied  # what the lineage would have re-applied
    with pytest.raises(ToolError, match="unknown candidate_id"):
        so.run(ctx, so.Request(state_id=HLI, candidate_id="c_nope"))


def test_a_suggestion_says_where_the_optimization_led_and_prefers_rich_states(ctx: ToolContext) -> None:
    # two optimizations of equal immediate worth; one led twice to a state with a lot left to gain
    with ctx.store.read() as view:
        pool = {s.optimization_id: s for s in view.candidates(HLI)}
    a, b = "fuse_epilogue_into_gemm", "online_softmax"  # both priced at 1.5x in this state
    assert pool[a].prior_mean_log_speedup == pool[b].prior_mean_log_speedup
    for i in range(3):
        _step(ctx, f"c_a{i}", a, None, time_ms=1.6, next_state=MBS)  # MBS has optimizations priced at up to 2x
        _step(ctx, f"c_b{i}", b, None, time_ms=1.6, next_state="hybrid_bound")  # at most 1.2x there
    with ctx.store.read() as view:
        leads = phase.leads(view, HLI)
        worth = phase.follow_on(view, HLI)
    (lead_a,) = leads[a]
    assert (lead_a.state_id, lead_a.count) == (MBS, 3) and lead_a.share == pytest.approx(3 / (3 + phase.STAY_PRIOR))
    assert worth[a] > worth[b]
    res = so.run(ctx, so.Request(state_id=HLI, k=10, temperature=0.0))
    shown = {s.id: s for s in res.suggestions}
    assert [n.state_id for n in shown[a].likely_next] == [MBS] and shown[a].likely_next[0].seen == 3
    others = [x for x in pool if x not in (a, b)]
    pair = so.run(ctx, so.Request(state_id=HLI, k=2, temperature=0.0, exclude=others))
    assert [s.id for s in pair.suggestions] == [a, b]
