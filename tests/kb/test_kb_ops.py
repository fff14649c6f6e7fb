"""Typed KB changes and their journal form: each op survives the round trip, the wire form stays
what earlier versions wrote, and what is not an op is refused."""

from __future__ import annotations

import pytest

from kb_mcp.kb.errors import KBNewerFormatError
from kb_mcp.kb.models import SCHEMA_VERSION
from kb_mcp.kb.ops import DropRecord, PutMeta, PutRecord, PutScore, from_wire, newer_op
from kb_mcp.kb.tables import Tables

ROW = [0.4, 0.01, 2, 3, 2, 1, 0, "2026-01-01T00:00:00+00:00"]


@pytest.mark.parametrize("op", [
    PutRecord("states", "s1", {"id": "s1"}),
    DropRecord("candidates", "c_1/abc"),
    PutMeta({"format": "kb-mcp", "schema_version": 1}),
    PutScore("s1", "hopper", "o1", [0.1, 1.0], ROW, "2026-01-01T00:00:00+00:00"),
    PutScore("s1", "*", "o1", [0.0, 1.0], None, "2026-01-01T00:00:00+00:00", "bf16"),
])
def test_ops_round_trip_through_the_wire(op: PutRecord | DropRecord | PutMeta | PutScore) -> None:
    assert from_wire(op.wire()) == op


def test_the_wire_form_is_the_journal_format() -> None:
    assert PutRecord("lessons", "l1", {"id": "l1"}).wire() == ["put", "lessons", "l1", {"id": "l1"}]
    assert PutMeta({"a": 1}).wire() == ["put", "meta", "meta", {"a": 1}]
    # fp32 is written without a track, as before tracks existed; other tracks name theirs
    assert PutScore("s", "*", "o", [0.0, 1.0], None, "t").wire() == ["score", "s", "*", "o", [0.0, 1.0], None, "t"]
    assert PutScore("s", "*", "o", [0.0, 1.0], None, "t", "tf32").wire()[-1] == "tf32"


@pytest.mark.parametrize(("wire", "found"), [
    (["frobnicate", "states", "s1"], "a KB change of kind 'frobnicate'"),
    (["put", "no_such_table", "k", {}], "a KB table 'no_such_table'"),
    (["drop", "meta", "meta"], "a KB table 'meta'"),
    (["score", "s", "*", "o", [0.0, 1.0], None, "t", "fp8"], "a KB track 'fp8'"),
    (["drop", "candidates", "k", "why"], "a 'drop' KB change of 4 fields (this kb-mcp knows 3)"),
    (["put", "states", "s1", {"id": "s1"}, {"new": 1}], "a 'put' KB change of 5 fields"),
])
def test_an_op_of_a_newer_kb_mcp_is_refused_as_newer_not_malformed(wire: list, found: str) -> None:
    with pytest.raises(KBNewerFormatError) as err:
        from_wire(wire)
    assert found in err.value.found and not isinstance(err.value, ValueError)
    assert err.value.whose == "environment" and "upgrade kb-mcp on this machine" in str(err.value).lower()
    assert newer_op([PutRecord("states", "s", {}).wire(), wire]) is not None


@pytest.mark.parametrize("wire", [
    [], "frobnicate", {"put": 1}, [7, "states", "s1"], ["put", 7, "k", {}], ["put", "states", "k"],
    ["score", "s", "*", "o", [0.0, 1.0], None, "t", 16],
])
def test_what_no_kb_mcp_writes_is_malformed_not_newer(wire: object) -> None:
    with pytest.raises((ValueError, KeyError, IndexError, TypeError)):
        from_wire(wire)  # type: ignore[arg-type]
    assert newer_op([wire]) is None


def test_tables_apply_typed_ops_and_replay_wire_ones() -> None:
    typed, replayed = Tables(), Tables()
    ops = [PutRecord("states", "s1", {"id": "s1", "signature": {"primary": "memory", "secondary": None}}),
           PutScore("s1", "*", "o1", [0.1, 1.0], ROW, "2026-01-01T00:00:00+00:00")]
    for op in ops:
        typed.apply(op)
    replayed.replay([op.wire() for op in ops])
    assert typed.records == replayed.records and typed.scores == replayed.scores
    assert typed.states_by_key == {"memory/-": ["s1"]}


def test_a_dropped_verdict_leaves_the_tables_and_every_index_replayed_or_not() -> None:
    typed, replayed = Tables(), Tables()
    verdict = {"candidate_id": "c_1", "problem_hash": "h", "verified_by": ["alice"], "options": {}}
    ops = [PutRecord("candidates", "c_1/k", verdict), DropRecord("candidates", "c_1/k"),
           DropRecord("candidates", "c_2/k")]  # dropping what is not there changes nothing
    for op in ops:
        typed.apply(op)
    replayed.replay([op.wire() for op in ops])
    for tables in (typed, replayed):
        assert tables.records["candidates"] == {}
        assert tables.verdicts_by_candidate == tables.verdicts_by_problem == tables.verdicts_by_sole_verifier == {}


def _outcome(key: str, cid: object, parent: object = None) -> dict[str, object]:
    return {"id": key, "candidate_id": cid, "parent_candidate_id": parent, "state_id": "s", "optimization_id": "o1"}


def _lesson(key: str, cid: object) -> dict[str, object]:
    return {"id": key, "candidate_id": cid, "state_id": "s", "optimization_id": "o1"}


def test_the_count_of_names_per_candidate_follows_puts_replacements_and_drops_replayed_or_loaded() -> None:
    ops = [
        PutMeta({"format": "kb-mcp", "schema_version": SCHEMA_VERSION}),
        PutRecord("outcomes", "o1", _outcome("o1", "c_child", "c_parent")),
        PutRecord("outcomes", "o2", _outcome("o2", "c_self", "c_self")),  # its own parent: named twice
        PutRecord("lessons", "l1", _lesson("l1", "c_child")),
        PutRecord("lessons", "l2", _lesson("l2", None)),  # a lesson of no candidate names none
        PutRecord("lessons", "l3", _lesson("l3", ["c_child"])),  # nor a field that is no candidate id (untrusted)
        PutRecord("outcomes", "o1", _outcome("o1", "c_child")),  # replaced: its parent is no longer named by it
        PutRecord("outcomes", "o3", _outcome("o3", "c_gone", "c_self")),
        DropRecord("outcomes", "o3"),
        DropRecord("outcomes", "o4"),  # dropping what is not there changes nothing
        PutRecord("candidates", "c_parent/k", {"candidate_id": "c_parent", "problem_hash": "h", "options": {}}),
    ]
    typed, replayed = Tables(), Tables()
    for op in ops:
        typed.apply(op)
    replayed.replay([op.wire() for op in ops])
    loaded = Tables.from_tinydb(typed.to_tinydb(), "kb.json")
    for tables in (typed, replayed, loaded):
        assert tables.names_by_candidate == {"c_child": 2, "c_self": 2}
    for op in [DropRecord("outcomes", "o1"), DropRecord("lessons", "l1"), DropRecord("outcomes", "o2")]:
        typed.apply(op)
    assert typed.names_by_candidate == {}
