"""The textual-gradient step on a real KB file: valid edits land in one transaction, invalid ones are
rejected with reasons, and the KB is never corrupted."""

from __future__ import annotations

import json
import math
from pathlib import Path

from fakellm import Answer, Rule, Script

from kb_mcp.campaign.textual_gradient import NO_LLM_NOTE, run_textual_gradient
from kb_mcp.kb import ids
from kb_mcp.kb.models import ALL_ARCH, Outcome, Score, Verdict
from kb_mcp.kb.store import KBStore

FUSE = "fuse_elementwise_chain"
HLI = "high_level_inefficiency"
MBS = "memory_bandwidth_saturated"


def _outcomes() -> list[Outcome]:
    rows = [(HLI, Verdict.faster, 1.6), (HLI, Verdict.slower, 0.9), (MBS, Verdict.compile_error, None)]
    return [
        Outcome(
            id=ids.outcome_id(f"c_{i}", FUSE), problem="p", candidate_id=f"c_{i}", state_id=state,
            optimization_id=FUSE, arch="hopper", verdict=verdict, speedup=speedup,
            analysis="fused three elementwise kernels into one" if speedup else "nvcc: expected a ';'",
        )
        for i, (state, verdict, speedup) in enumerate(rows)
    ]


def _measured(store: KBStore, state: str, opt: str, speedup: float, samples: int) -> None:
    """Gives a score measured statistics, as numeric updates would have."""
    with store.transaction() as tx:
        base = tx.get_score(state, opt, ALL_ARCH) or Score(state_id=state, optimization_id=opt)
        tx.put_score(base.model_copy(update={
            "mean_log_speedup": math.log(speedup), "samples": samples, "attempts": samples, "prior": False,
        }))


VALID = [
    {"kind": "add_lesson", "state_id": HLI, "optimization_id": FUSE,
     "text": "Fusing pays most when the chain has three or more ops; two ops gave only 1.1x.",
     "reason": "batch outcomes 0 and 1"},
    {"kind": "adjust_prior", "state_id": MBS, "optimization_id": FUSE, "expected_speedup": 1.05, "weight": 2.0,
     "reason": "compile failed, gain unproven in this state"},
    {"kind": "add_optimization", "name": "Vectorize global loads with float4",
     "description": "Load and store four consecutive floats per thread with float4 so each warp issues 128-byte "
                    "transactions.",
     "category": "memory_access", "applicable_states": [MBS], "expected_speedup": 1.2,
     "reason": "seen in the analysis"},
    {"kind": "add_lesson", "state_id": MBS, "optimization_id": "agent_vectorize_global_loads_with_float4",
     "text": "Check 16-byte alignment of the base pointer before using float4 loads.",
     "reason": "follows the new optimization"},
    {"kind": "add_state", "name": "Compute bound, unclassified", "primary": "compute", "secondary": None,
     "description": "Compute pipes are busy but no single pipe or instruction class explains it yet.",
     "ranges": [{"metric": "sm_throughput_pct", "min": 60}],
     "reason": "two kernels matched no compute state"},
]
INVALID = [
    ({"kind": "add_lesson", "state_id": "no_such_state", "optimization_id": FUSE, "text": "x" * 30,
      "reason": "because of x"},
     "unknown state"),
    ({"kind": "rewrite_everything", "reason": "because I can"}, "unknown kind"),
    ({"kind": "adjust_prior", "state_id": HLI, "optimization_id": FUSE, "expected_speedup": 50,
      "reason": "huge gains!!"},
     "less than or equal to 4"),
    ({"kind": "adjust_prior", "state_id": HLI, "optimization_id": FUSE, "expected_speedup": 0.5,
      "reason": "it never helps, really"},
     "contradicts 4 measurements"),
    ({"kind": "deprecate_optimization", "optimization_id": FUSE, "reason": "one compile error seen"},
     "contradict deprecating"),
    ({"kind": "add_optimization", "name": "Fuse a chain of elementwise ops into one kernel", "category": "fusion",
      "description": "A duplicate of the seed optimization with the very same name, which must be refused.",
      "applicable_states": [HLI], "reason": "duplicate name test"}, "already exists"),
    ({"kind": "add_state", "name": "Odd pair", "primary": "memory", "secondary": "fp32_pipe",
      "description": "A state whose secondary bottleneck belongs to another primary bottleneck.",
      "reason": "mismatch test"},
     "belongs to primary 'compute'"),
    ({"kind": "add_state", "name": "Another DRAM state", "primary": "memory", "secondary": "dram_bandwidth",
      "description": "Same signature as the seed DRAM state, so it would never be chosen over it.",
      "reason": "duplicate of a seed state"},
     "already the state memory_bandwidth_saturated"),
    ({"kind": "add_lesson", "state_id": HLI, "optimization_id": FUSE, "text": "short", "reason": "too short lesson"},
     "at least 20 characters"),
    # what an LLM may do to priors is bounded: a x2 move per update, a weight of 2 pseudo-samples
    ({"kind": "adjust_prior", "state_id": MBS, "optimization_id": FUSE, "expected_speedup": 3.0,
      "reason": "much better"},
     "one update may move it within 0.65x..2.60x"),
    ({"kind": "adjust_prior", "state_id": MBS, "optimization_id": FUSE, "expected_speedup": 1.2, "weight": 8,
      "reason": "very sure about it"}, "less than or equal to 2"),
    ({"kind": "add_lesson", "state_id": HLI, "optimization_id": FUSE, "outcome_id": "out_missing",
      "text": "A lesson citing an outcome the KB does not hold.", "reason": "forged provenance"}, "unknown outcome"),
]


def _script(edits: list[dict]) -> Script:
    evaluation = {"summary": "fusion over-predicted in MBS", "items": [
        {"state_id": HLI, "optimization_id": FUSE, "assessment": "accurate", "comment": "1.6x and 0.9x"},
        {"state_id": MBS, "optimization_id": FUSE, "assessment": "overestimated", "comment": "did not compile"}]}
    analysis = {"summary": "s", "gaps": [{"state_id": MBS, "optimization_id": FUSE,
                                          "cause": "syntax error in the fused kernel"}]}
    return Script(rules=[
        Rule(role="evaluate", answers=[Answer(text="Here:\n```json\n" + json.dumps(evaluation) + "\n```")]),
        Rule(role="analyze", answers=[Answer(text=json.dumps(analysis))]),
        Rule(role="update", answers=[Answer(text="```json\n" + json.dumps({"edits": edits,
                                                                           "summary": "s"}) + "\n```")]),
    ])


def _files(kb: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in kb.parent.iterdir()
        if p.name.startswith(kb.name) and not p.name.endswith((".lock", ".lock.holder"))
    }


def test_valid_edits_applied_in_one_transaction_invalid_rejected(tmp_path: Path, fake_llm, client_for) -> None:
    kb = tmp_path / "kb.json"
    store = KBStore.open(kb)
    _measured(store, HLI, FUSE, 1.5, samples=4)
    before = store.stats()
    journal_lines = (kb.with_name(kb.name + ".journal")).read_bytes().count(b"\n")
    edits = VALID[:2] + [e for e, _ in INVALID] + VALID[2:]
    server = fake_llm(_script(edits))
    outcomes = _outcomes()
    record = run_textual_gradient(client_for(server), store, outcomes, {(HLI, FUSE): 1.8, (MBS, FUSE): 1.3}, index=1)

    assert record.error is None
    assert [e["kind"] for e in record.applied] == [e["kind"] for e in VALID]
    assert len(record.rejected) == len(INVALID)
    for edit, needle in INVALID:  # each invalid edit is rejected, for its own reason
        assert any(needle in r.reason and r.edit.get("kind") == edit["kind"] for r in record.rejected), needle
    # the evaluation prompt carried the numbers computed from the outcomes, not the model's
    first = server.requests_for("evaluate")[0].last_user
    assert '"predicted_speedup": 1.8' in first and '"measured_geomean": 1.2' in first
    # one transaction: exactly one journal line for all the valid edits
    assert kb.with_name(kb.name + ".journal").read_bytes().count(b"\n") == journal_lines + 1

    fresh = KBStore.open(kb)  # a new process's view of the file
    after = fresh.stats()
    assert after.lessons == before.lessons + 2
    assert sum(after.states.values()) == sum(before.states.values()) + 1
    assert after.optimizations.get("campaign") == 1
    lesson = fresh.lessons(HLI, FUSE)[0]
    assert lesson.source == "textual_gradient" and "three or more" in lesson.text
    prior = fresh.get_score(MBS, FUSE)
    assert math.isclose(math.exp(prior.prior_mean_log_speedup), 1.05) and prior.prior_weight == 2.0
    measured = fresh.get_score(HLI, FUSE)
    assert measured.samples == 4 and math.isclose(measured.mean_log_speedup, math.log(1.5))  # evidence untouched
    new_opt = fresh.get_optimization("agent_vectorize_global_loads_with_float4")
    assert new_opt is not None and new_opt.origin == "campaign"
    assert "agent_vectorize_global_loads_with_float4" in [s.optimization_id for s in fresh.candidates(MBS)]
    new_state = fresh.get_state("discovered_compute_unspecified")
    assert (
        new_state is not None and new_state.origin == "discovered" and new_state.name == "Compute bound, unclassified"
    )
    assert new_state.parent_id is not None  # inherits its nearest state's optimizations
    inherited = {c.optimization_id for c in fresh.candidates(new_state.id)}
    assert inherited == {c.optimization_id for c in fresh.candidates(new_state.parent_id)}
    assert not fresh.get_optimization(FUSE).deprecated


def test_only_invalid_edits_leave_the_kb_byte_identical(tmp_path: Path, fake_llm, client_for) -> None:
    kb = tmp_path / "kb.json"
    store = KBStore.open(kb)
    _measured(store, HLI, FUSE, 1.5, samples=4)
    files = _files(kb)
    server = fake_llm(_script([e for e, _ in INVALID]))
    record = run_textual_gradient(client_for(server), store, _outcomes(), {})
    assert record.applied == [] and len(record.rejected) == len(INVALID)
    assert _files(kb) == files
    KBStore.open(kb).stats()  # still loads


def test_unusable_update_answer_applies_nothing(tmp_path: Path, fake_llm, client_for) -> None:
    kb = tmp_path / "kb.json"
    store = KBStore.open(kb)
    files = _files(kb)
    script = _script([])
    script.rules[2] = Rule(role="update", answers=[Answer(text="I'm sorry, I can't help with that.")])
    server = fake_llm(script)
    record = run_textual_gradient(client_for(server), store, _outcomes(), {}, answer_retries=1)
    assert record.error is not None and "update" in record.error
    assert record.evaluation is not None and record.analysis is not None and record.applied == []
    assert len(server.requests_for("update")) == 2
    assert _files(kb) == files


def test_without_llm_numeric_only(tmp_path: Path) -> None:
    store = KBStore.open(tmp_path / "kb.json")
    record = run_textual_gradient(None, store, _outcomes(), {})
    assert record.error == NO_LLM_NOTE and record.applied == []
