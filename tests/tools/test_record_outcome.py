"""record_outcome between clients of one KB: who may record a candidate, what another client's records
can change (lessons, lineage, scores), and the ids a request may name. Verdicts are stored through
compile_and_verify's own `record`, as a verification stores them, against a real KB file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from kb_mcp.harness.judgment.findings import Timings
from kb_mcp.harness.judgment.verdict import CompileResult, InputSetCheck, VerifyResult
from kb_mcp.harness.problem import candidate_id, load_problem
from kb_mcp.kb.models import CandidateRecord, Verdict
from kb_mcp.tools import compile_and_verify
from kb_mcp.tools import record_outcome as ro
from kb_mcp.tools import suggest_optimizations as so
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext

STATE = "memory_bandwidth_saturated"
OPT = "fuse_elementwise_chain"
PROBLEM = load_problem(str(Path(__file__).resolve().parents[2] / "examples" / "problems" / "swish.py"))


def _verify(ctx: ToolContext, source: str, verdict: Verdict) -> str:
    """Stores `ctx`'s verdict on a candidate the way compile_and_verify does; returns its candidate_id."""
    valid = verdict.is_valid
    cid = candidate_id(PROBLEM, source)
    timings = Timings(candidate_ms=1.0, candidate_min_ms=1.0, candidate_host_ms=1.0, runs=10, eager_ms=1.6,
                      speedup_vs_baseline=1.6) if valid else None
    result = VerifyResult(
        candidate_id=cid, problem=PROBLEM.name, problem_hash=PROBLEM.hash, verdict=verdict, summary=verdict.value,
        compile=CompileResult(ok=verdict != Verdict.compile_error),
        input_sets=[InputSetCheck(index=0, kind="secret", passed=valid)] if valid else [],
        device="NVIDIA H100 80GB HBM3" if valid else "", arch="sm_90" if valid else "", timings=timings,
    )
    request = compile_and_verify.Request(problem=PROBLEM.source, candidate=source)
    compile_and_verify.record(ctx, request, PROBLEM, source, result)
    return cid


def _made(ctx: ToolContext, cid: str) -> list[str]:
    """Who recorded the outcomes stored for the candidate."""
    with ctx.store.read() as view:
        return [o.agent for o in view.outcomes_for_candidate(cid)]


def _clients(kb_path: Path, *names: str) -> list[ToolContext]:
    return [ToolContext(kb_path, client_name=n) for n in names]


def _suggested(ctx: ToolContext, opt: str) -> so.Suggestion:
    """What suggest_optimizations says of `opt` in STATE."""
    others = [s.optimization_id for s in ctx.store.candidates(STATE) if s.optimization_id != opt]
    (only,) = so.run(ctx, so.Request(state_id=STATE, k=10, temperature=0.0, exclude=others)).suggestions
    return only


def _shown(ctx: ToolContext, opt: str) -> list[tuple[str, str | None]]:
    """(author, outcome) of the lessons suggest_optimizations shows with `opt` in STATE."""
    return [(x.author, x.outcome_id) for x in _suggested(ctx, opt).lessons]


# ---- lessons ------------------------------------------------------------------------------------------


def test_a_shown_lesson_keeps_its_author_when_another_client_tells_its_text_with_a_failure(kb_path: Path) -> None:
    writer, other, reader = _clients(kb_path, "writer", "other", "reader")
    text = "Fusing the bias add into the GEMM epilogue saved one full pass over the output."
    good = ro.run(writer, ro.Request(state_id=STATE, optimization_id=OPT, lesson=text,
                                     candidate_id=_verify(writer, "# fused", Verdict.faster)))
    assert _shown(reader, OPT) == [("writer", good.outcome_id)]

    # the same text (whitespace does not count in a lesson's id) told with a compile error
    bad = ro.run(other, ro.Request(state_id=STATE, optimization_id=OPT, lesson=text.replace(" ", "  "),
                                   candidate_id=_verify(other, "# broken", Verdict.compile_error)))
    assert bad.recorded
    assert _shown(reader, OPT) == [("writer", good.outcome_id)]


def test_a_hidden_lesson_gives_way_to_the_same_text_from_a_verified_outcome(kb_path: Path) -> None:
    first, second, reader = _clients(kb_path, "first", "second", "reader")
    text = "Loading rows as float4 halved the load instructions of the epilogue."
    ro.run(first, ro.Request(state_id=STATE, optimization_id=OPT, lesson=text,
                             candidate_id=_verify(first, "# broken", Verdict.compile_error)))
    assert _shown(reader, OPT) == []  # a lesson of a failure is never shown
    good = ro.run(second, ro.Request(state_id=STATE, optimization_id=OPT, lesson=text,
                                     candidate_id=_verify(second, "# float4", Verdict.faster)))
    assert _shown(reader, OPT) == [("second", good.outcome_id)]


# ---- who may record a candidate -------------------------------------------------------------------------


def test_only_a_client_that_verified_a_candidate_may_record_its_outcomes(kb_path: Path) -> None:
    owner, other = _clients(kb_path, "owner", "other")
    cid = _verify(owner, "# owner's kernel", Verdict.compile_error)
    for s in other.store.candidates(STATE)[:5]:
        with pytest.raises(ToolError, match="verified by another client.*only a client whose compile_and_verify"):
            ro.run(other, ro.Request(state_id=STATE, optimization_id=s.optimization_id, candidate_id=cid))
    assert _made(other, cid) == []

    suggested = so.run(owner, so.Request(state_id=STATE, k=10, candidate_id=cid))
    assert len(suggested.suggestions) == 10 and suggested.lineage_excluded == []
    mine = ro.run(owner, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid))
    assert mine.recorded and _made(owner, cid) == ["owner"]


def test_a_candidate_verified_again_by_another_client_keeps_its_first_verifier(kb_path: Path) -> None:
    owner, again = _clients(kb_path, "owner", "again")
    cid = _verify(owner, "# one kernel", Verdict.faster)
    assert _verify(again, "# one kernel", Verdict.faster) == cid  # the same source: the same verdict key
    with owner.store.read() as view:
        assert [v.verified_by for v in view.candidate_verdicts(cid)] == [["owner", "again"]]
    assert ro.run(owner, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid)).recorded
    assert not ro.run(again, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid)).recorded


def test_a_weaker_check_of_another_clients_timed_candidate_does_not_let_its_client_record_it(kb_path: Path) -> None:
    """A compile-only check of a source another client timed on a GPU (its text is in kb://candidate)
    would let an outcome claim that other client's measurement, and take the (candidate, optimization)
    outcome the timing client would record: it does not make its client one who may record it."""
    timer, checker = _clients(kb_path, "agent:bob", "agent:alice")
    cid = _verify(timer, "# bob's kernel", Verdict.faster)
    assert _verify(checker, "# bob's kernel", Verdict.needs_gpu) == cid  # built, never timed
    with pytest.raises(ToolError, match=r"verified by another client.*strongest verdict.*standard on NVIDIA H100"
                                        r".*default options on a GPU"):
        ro.run(checker, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid, lesson="alice's lesson"))
    assert _made(checker, cid) == []
    assert ro.run(timer, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid)).recorded
    assert _made(timer, cid) == ["agent:bob"]


def test_a_verdict_stored_before_verifiers_were_kept_stays_recordable_by_any_client(kb_path: Path) -> None:
    anyone = ToolContext(kb_path, client_name="anyone")
    with anyone.store.transaction() as tx:  # a record of an older KB file: no verified_by
        tx.put_candidate(CandidateRecord(candidate_id="c_0ld", problem="p", problem_hash="h",
                                         verdict=Verdict.compile_error))
    assert ro.run(anyone, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id="c_0ld")).recorded


# ---- one candidate, one credit -------------------------------------------------------------------------

OTHER_OPT = "vectorize_global_access"
OTHER_STATE = "compute_throughput_saturated"


def _credited(ctx: ToolContext, state: str = STATE, opt: str = OPT) -> str:
    """A faster candidate verified by `ctx`, recorded for `opt` in `state`; returns its candidate_id."""
    cid = _verify(ctx, f"# one fast kernel for {state} {opt}", Verdict.faster)
    assert ro.run(ctx, ro.Request(state_id=state, optimization_id=opt, candidate_id=cid)).recorded
    return cid


def test_a_candidate_credited_to_one_optimization_is_refused_for_another_and_nothing_moves(kb_path: Path) -> None:
    (agent,) = _clients(kb_path, "agent")
    cid = _credited(agent)
    before = agent.store.snapshot()
    with pytest.raises(ToolError, match=rf"candidate {cid} already credits optimization '{OPT}' in state '{STATE}'"
                                        r".*record the main change.*`analysis`.*its own candidate"):
        ro.run(agent, ro.Request(state_id=STATE, optimization_id=OTHER_OPT, candidate_id=cid,
                                 next_state_id=OTHER_STATE, lesson="Vectorized loads helped here as well."))
    assert agent.store.snapshot() == before  # no score, transition, lesson or outcome of OTHER_OPT
    with agent.store.read() as view:
        assert [o.optimization_id for o in view.outcomes()] == [OPT]
    # the same candidate and optimization again is still the idempotent repeat
    again = ro.run(agent, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid))
    assert not again.recorded and agent.store.snapshot() == before


def test_a_second_client_that_verified_the_candidate_cannot_credit_it_to_another_optimization(
        kb_path: Path) -> None:
    owner, again = _clients(kb_path, "owner", "again")
    cid = _credited(owner)
    assert _verify(again, f"# one fast kernel for {STATE} {OPT}", Verdict.faster) == cid
    before = again.store.snapshot()
    with pytest.raises(ToolError, match=rf"already credits optimization '{OPT}'.*recorded by 'owner'"):
        ro.run(again, ro.Request(state_id=STATE, optimization_id=OTHER_OPT, candidate_id=cid))
    assert again.store.snapshot() == before and _made(again, cid) == ["owner"]


def test_a_credited_candidate_cannot_create_an_optimization_of_its_own(kb_path: Path) -> None:
    (agent,) = _clients(kb_path, "agent")
    cid = _credited(agent)
    before = agent.store.snapshot()
    idea = ro.NewOptimization(name="Cache row max in registers",
                              description="keep the running row maximum in a register across the tile loop")
    with pytest.raises(ToolError, match=rf"already credits optimization '{OPT}'"):
        ro.run(agent, ro.Request(state_id=STATE, new_optimization=idea, candidate_id=cid,
                                 lesson="Registers beat shared memory for the row max."))
    assert agent.store.snapshot() == before
    assert [o.id for o in agent.store.list_optimizations() if o.origin == "agent"] == []


def test_a_credited_candidate_cannot_be_credited_again_in_another_state(kb_path: Path) -> None:
    (agent,) = _clients(kb_path, "agent")
    cid = _credited(agent)
    before = agent.store.snapshot()
    with pytest.raises(ToolError, match=rf"already credits optimization '{OPT}' in state '{STATE}'"):
        ro.run(agent, ro.Request(state_id=OTHER_STATE, optimization_id=OTHER_OPT, candidate_id=cid))
    # the same optimization named with another state is the same outcome: nothing changes
    same = ro.run(agent, ro.Request(state_id=OTHER_STATE, optimization_id=OPT, candidate_id=cid))
    assert not same.recorded and f"in state '{STATE}'" in same.note
    assert agent.store.snapshot() == before


def test_a_failed_candidate_lowers_one_optimization_only(kb_path: Path) -> None:
    (agent,) = _clients(kb_path, "agent")
    cid = _verify(agent, "# broken", Verdict.compile_error)
    assert ro.run(agent, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid)).recorded
    before = agent.store.snapshot()
    with pytest.raises(ToolError, match=rf"already credits optimization '{OPT}'"):
        ro.run(agent, ro.Request(state_id=STATE, optimization_id=OTHER_OPT, candidate_id=cid))
    assert agent.store.snapshot() == before


# ---- the ids a request names -------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["candidate_id", "parent_candidate_id", "state_id", "next_state_id",
                                   "optimization_id"])
def test_an_id_longer_than_any_real_one_is_refused_by_the_request(field: str) -> None:
    args = {"state_id": STATE, "optimization_id": OPT, "candidate_id": "c_0123456789abcdef",
            field: "c_" + "a" * 5_000_000}
    with pytest.raises(ValidationError, match=f"{field}\n  String should have at most {ro.MAX_ID} characters"):
        ro.Request.model_validate(args)


def test_a_parent_that_names_no_verified_candidate_is_refused_and_nothing_is_stored(kb_path: Path) -> None:
    ctx = ToolContext(kb_path, client_name="agent")
    cid = _verify(ctx, "# child", Verdict.compile_error)
    with pytest.raises(ToolError, match="unknown parent_candidate_id 'c_0123456789abcdef': a parent must be"):
        ro.run(ctx, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid,
                               parent_candidate_id="c_0123456789abcdef"))
    assert _made(ctx, cid) == []
    parent = _verify(ctx, "# parent", Verdict.compile_error)
    done = ro.run(ctx, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid, parent_candidate_id=parent))
    assert done.recorded and ctx.store.get_outcome(done.outcome_id).parent_candidate_id == parent  # type: ignore[union-attr]


# ---- scores ---------------------------------------------------------------------------------------------


def test_one_clients_failures_do_not_cancel_other_clients_successes(kb_path: Path) -> None:
    opt = "vectorize_global_access"
    for i in range(8):  # eight clients each verified a faster kernel with it
        (honest,) = _clients(kb_path, f"honest{i}")
        ro.run(honest, ro.Request(state_id=STATE, optimization_id=opt,
                                  candidate_id=_verify(honest, f"# kernel {i}", Verdict.faster)))
    (reader,) = _clients(kb_path, "reader")
    before = _suggested(reader, opt).success_chance
    (noisy,) = _clients(kb_path, "noisy")
    for i in range(40):  # compile errors: compile-only checks, no GPU needed
        ro.run(noisy, ro.Request(state_id=STATE, optimization_id=opt,
                                 candidate_id=_verify(noisy, f"# broken {i}", Verdict.compile_error)))
    after = _suggested(reader, opt).success_chance
    assert before > 0.9 and after > 0.5, f"success_chance {before} -> {after}"


def _merged_from(tmp_path: Path, kb_path: Path, *sources: str, slow_ms: float | None = None) -> list[str]:
    """Verifies `sources` on another KB (as client 'teammate'), merges that file into `kb_path`; returns
    their candidate ids. With `slow_ms`, the other file claims that time for them (a forged verdict)."""
    from kb_mcp.kb.interchange import merge_kb
    from kb_mcp.kb.store import KBStore
    from kb_mcp.policy import update

    theirs = ToolContext(tmp_path / "theirs.json", client_name="teammate")
    cids = [_verify(theirs, source, Verdict.faster) for source in sources]
    if slow_ms is not None:
        with theirs.store.transaction() as tx:
            for cid in cids:
                rec = tx.get_candidate(cid)
                assert rec is not None
                tx.put_candidate(rec.model_copy(update={"time_ms": slow_ms, "eager_ms": slow_ms}))
    merge_kb(KBStore.open(kb_path), theirs.kb_path, update)
    return cids


def test_a_verdict_merged_in_from_another_kb_file_is_shown_but_never_recorded(kb_path: Path, tmp_path: Path) -> None:
    (cid,) = _merged_from(tmp_path, kb_path, "# a teammate's kernel\n")
    mine = ToolContext(kb_path, client_name="teammate")  # even under the name its verifier had there
    with mine.store.read() as view:
        shown = view.get_candidate(cid)
        assert shown is not None and shown.imported_from == str(tmp_path / "theirs.json")
        assert view.own_candidate(cid) is None and not view.speaks_for(cid, "teammate")
    with pytest.raises(ToolError, match=r"merged in from another KB file .*theirs\.json.*only from this server's own"):
        ro.run(mine, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid))
    assert _made(mine, cid) == []
    # verified here, the same source is this server's own verdict, and its verifier may record it
    assert _verify(mine, "# a teammate's kernel\n", Verdict.faster) == cid
    with mine.store.read() as view:
        own = view.own_candidate(cid)
        assert own is not None and own.imported_from is None and own.verified_by == ["teammate"]
    assert ro.run(mine, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid)).recorded


def test_a_parent_merged_in_with_a_forged_slow_time_inflates_no_credit(kb_path: Path, tmp_path: Path) -> None:
    (parent,) = _merged_from(tmp_path, kb_path, "# the parent\n", slow_ms=1000.0)
    mine = ToolContext(kb_path, client_name="me")
    child = _verify(mine, "# the child\n", Verdict.faster)  # 1.0 ms, eager 1.6 ms
    res = ro.run(mine, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=child,
                                  parent_candidate_id=parent))
    assert res.recorded and "speedup is over eager PyTorch" in res.note
    with mine.store.read() as view:
        (outcome,) = view.outcomes_for_candidate(child)
    assert outcome.speedup is not None and outcome.speedup < 2.0  # 1.6x over eager, not 1000x over the parent
