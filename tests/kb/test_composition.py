"""The verdict a composition takes for a problem (`kb.composition`): the pick kept by the tables' index
is `best_verdict` over the problem's verdicts that validate, whatever happened to them (puts,
replacements, drops, the journal replayed, a file loaded) and whatever a KB file holds (damaged
records, fields in forms the KB does not write)."""

from __future__ import annotations

import random
from typing import Any

from pydantic import ValidationError

from kb_mcp.kb.composition import best_verdict, rank, raw_rank, takes
from kb_mcp.kb.models import SCHEMA_VERSION, CandidateRecord, Verdict, options_digest
from kb_mcp.kb.ops import DropRecord, KBOp, PutMeta, PutRecord
from kb_mcp.kb.tables import Tables
from kb_mcp.kb.view import KBView

PROBLEMS = ("h_a", "h_b", "h_c")
# the first and third are one instant; the rest are forms the KB does not write, or no time at all
TIMES = ("2026-12-01T10:00:00Z", "2026-12-01T10:00:00.5+00:00", "2026-12-01T12:00:00+02:00",
         "2026-12-01T10:00:00", "2026-12-02 09:00:00", "2026-12-03", 1764583200, "2026-02-30T10:00:00Z", "soon")
SPEEDUPS = (None, 0.0, 1.5, 2.0, 2.0, 3.25, 2, "2.5", "fast", float("inf"))


def _doc(rng: random.Random, cid: str) -> dict[str, Any]:
    """A stored verdict as a KB file may hold it: mostly the KB's own form, some in other forms that still
    validate, some damaged."""
    doc: dict[str, Any] = {"candidate_id": cid, "problem": "p", "problem_hash": rng.choice(PROBLEMS),
                           "verdict": rng.choice(["faster", "faster", "faster", "slower", "bogus", 3]),
                           "device": rng.choice(["", "NVIDIA H100"]), "arch": rng.choice(["", "sm_90"]),
                           "speedup_vs_baseline": rng.choice(SPEEDUPS), "created_at": rng.choice(TIMES)}
    strength = rng.choice(["standard", "standard", "quick", "compile_only", None, "absent"])
    if strength != "absent":  # absent: the legacy rule decides from the device
        doc["strength"] = strength
    flagged = rng.choice([False, False, True, "true", 0, None, "absent"])
    if flagged != "absent":
        doc["flagged"] = flagged
    if rng.random() < 0.1:
        doc["coverage"] = rng.choice([0.5, "most"])
    if rng.random() < 0.05:
        doc["not_a_field"] = 1  # CandidateRecord forbids extras: a damaged record
    if rng.random() < 0.05:
        doc.pop("problem")
    return doc


def _key(doc: dict[str, Any]) -> str:
    return f"{doc['candidate_id']}/{options_digest(doc.get('options') or {}, doc['device'], doc['arch'])}"


def _validated(tables: Tables, problem: str) -> list[CandidateRecord]:
    """The problem's verdicts that validate: what `best_verdict` is the rule over."""
    found = []
    for key in tables.verdicts_by_problem.get(problem, []):
        try:
            found.append(CandidateRecord.model_validate(tables.records["candidates"][key]))
        except ValidationError:
            pass
    return found


def _assert_picks_follow_the_rule(tables: Tables, candidates: list[str]) -> None:
    view = KBView(tables)
    picks = {}
    for problem in PROBLEMS:
        expected = best_verdict(_validated(tables, problem))
        got = view.composed_verdict(problem)
        assert (got and got.model_dump()) == (expected and expected.model_dump()), problem
        picks[problem] = expected
    for cid in candidates:
        taken = any(p is not None and p.candidate_id == cid for p in picks.values())
        assert view.composition_takes(cid) == taken, cid


def _random_ops(seed: int, n: int) -> list[KBOp]:
    rng = random.Random(seed)
    ops: list[KBOp] = []
    keys: list[str] = []
    for _ in range(n):
        if keys and rng.random() < 0.25:
            ops.append(DropRecord("candidates", rng.choice(keys)))
            continue
        doc = _doc(rng, f"c_{rng.randrange(12)}")  # few ids: verdicts are replaced under their key too
        keys.append(_key(doc))
        ops.append(PutRecord("candidates", _key(doc), doc))
    return ops


def test_the_kept_pick_of_each_problem_is_best_verdict_of_its_valid_verdicts_through_puts_and_drops() -> None:
    candidates = [f"c_{i}" for i in range(12)]
    for seed in range(40):
        ops = _random_ops(seed, 60)
        asked = Tables()  # asked after every change: its picks are kept up to date one change at a time
        asked.apply(PutMeta({"format": "kb-mcp", "schema_version": SCHEMA_VERSION}))
        for op in ops:
            asked.apply(op)
            _assert_picks_follow_the_rule(asked, candidates)
        replayed = Tables()  # asked first at the end: each problem ranked at once
        replayed.replay([op.wire() for op in ops])
        _assert_picks_follow_the_rule(replayed, candidates)
        loaded = Tables.from_tinydb(asked.to_tinydb(), "kb.json")
        _assert_picks_follow_the_rule(loaded, candidates)


def test_a_damaged_verdict_that_would_rank_first_is_never_picked_until_a_valid_one_replaces_it() -> None:
    good = {"candidate_id": "c_good", "problem": "p", "problem_hash": "h", "verdict": "faster", "device": "H100",
            "arch": "sm_90", "speedup_vs_baseline": 2.0, "created_at": "2026-12-01T10:00:00Z"}
    damaged = {**good, "candidate_id": "c_damaged", "speedup_vs_baseline": 9.0, "coverage": "most"}
    tables = Tables()
    for doc in (good, damaged):
        tables.apply(PutRecord("candidates", _key(doc), doc))
    view = KBView(tables)
    picked = view.composed_verdict("h")
    assert picked is not None and picked.candidate_id == "c_good"
    assert not view.composition_takes("c_damaged") and view.composition_takes("c_good")
    tables.apply(PutRecord("candidates", _key(damaged), {**damaged, "coverage": 0.5}))  # repaired
    picked = view.composed_verdict("h")
    assert picked is not None and picked.candidate_id == "c_damaged"
    tables.apply(DropRecord("candidates", _key(damaged)))
    picked = view.composed_verdict("h")
    assert picked is not None and picked.candidate_id == "c_good"


def test_the_raw_rank_of_a_stored_verdict_is_the_rank_of_the_record_it_validates_to() -> None:
    rng = random.Random(7)
    for i in range(3000):
        doc = _doc(rng, f"c_{i}")
        try:
            record = CandidateRecord.model_validate(doc)
        except ValidationError:
            continue  # may rank from its raw fields: the index validates what it picks (the test above)
        assert raw_rank(doc) == (rank(record) if takes(record) else None), doc


def test_the_kbs_own_form_of_a_verdict_is_ranked_without_validating_it() -> None:
    record = CandidateRecord(candidate_id="c_1", problem="p", problem_hash="h", verdict=Verdict.faster, arch="sm_90",
                             device="H100", speedup_vs_baseline=2.0)
    doc = record.model_dump(mode="json")
    doc["verified_by"] = "not a list"  # would not validate: the raw reading never looks at it
    assert raw_rank(doc) == rank(record)


def test_best_verdict_takes_the_same_one_whatever_order_the_verdicts_are_read_in() -> None:
    made = dict(problem="p", problem_hash="h", verdict=Verdict.faster, arch="sm_90", device="H100",
                speedup_vs_baseline=2.0, created_at="2026-12-01T10:00:00Z")
    records = [CandidateRecord.model_validate({**made, "candidate_id": f"c_{i}"}) for i in range(6)]
    picked = {best_verdict(random.Random(seed).sample(records, len(records))).candidate_id  # type: ignore[union-attr]
              for seed in range(20)}
    assert picked == {"c_5"}  # equal speedup and time: the greatest verdict key
