"""Export, import and merge of KB files, the reference shape round trip, and the `kb` CLI."""

from __future__ import annotations

import json
import math
import random
import resource
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from kb_mcp.kb import ids, interchange, journal
from kb_mcp.kb.interchange import InterchangeError, export_kb, merge_kb
from kb_mcp.kb.models import ALL_ARCH, CandidateRecord, Lesson, Score, Verdict
from kb_mcp.kb.reference_kb import export_reference, import_reference
from kb_mcp.kb.store import KBStore
from kb_mcp.policy import update
from kb_mcp.policy.update import CLIENT_MAX_WEIGHT, MAX_WEIGHT
from kb_mcp.tools import record_outcome as ro
from kb_mcp.tools import suggest_optimizations as so
from kb_mcp.tools.context import ToolContext

SAMPLE = Path(__file__).with_name("data") / "reference_kb.json"
STATE, OPT = "memory_bandwidth_saturated", "vectorize_global_access"


def _record(kb: Path, cid: str, time_ms: float, *, verdict: Verdict = Verdict.faster,
            next_state: str | None = None, opt: str = OPT) -> None:
    ctx = ToolContext(kb, client_name=f"agent-{cid}")  # one client per record: no per-client bound applies
    with ctx.store.transaction() as tx:
        tx.put_candidate(CandidateRecord(candidate_id=cid, problem="p", problem_hash="h", verdict=verdict, arch="sm_90",
                                         time_ms=time_ms, eager_ms=2.0))
    ro.run(ctx, ro.Request(state_id=STATE, optimization_id=opt, candidate_id=cid, next_state_id=next_state))


def test_export_is_a_standalone_kb_with_the_journal_folded_in(tmp_path: Path) -> None:
    kb = tmp_path / "a.json"
    _record(kb, "c_1", 1.0)
    out = export_kb(KBStore.open(kb), tmp_path / "copy.json")
    assert not Path(str(out) + ".journal").exists()
    copy = KBStore.open(out, create=False)
    assert copy.get_score(STATE, OPT, "hopper").samples == 1  # type: ignore[union-attr]
    with pytest.raises(InterchangeError, match="exists"):
        export_kb(KBStore.open(kb), out)
    with pytest.raises(InterchangeError, match="being exported"):
        export_kb(KBStore.open(kb), kb)


def test_merge_pools_exactly_and_counts_shared_history_once(tmp_path: Path) -> None:
    rng = random.Random(4)
    times = {f"c_{i}": 1.3 + 0.6 * rng.random() for i in range(9)}  # speedups within the influence band
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for cid in list(times)[:3]:  # common history
        _record(a, cid, times[cid], next_state="compute_throughput_saturated")
    export_kb(KBStore.open(a), b)
    for cid in list(times)[3:5]:
        _record(a, cid, times[cid])
    for cid in list(times)[5:]:
        _record(b, cid, times[cid], next_state="compute_throughput_saturated")
    _record(b, "c_bad", 1.0, verdict=Verdict.incorrect)

    report = merge_kb(KBStore.open(a), b, update)
    assert report.outcomes_shared == 3 and report.outcomes_added == 5
    logs = [math.log(2.0 / t) for t in times.values()]
    for arch in ("hopper", ALL_ARCH):
        s = KBStore.open(a).get_score(STATE, OPT, arch)
        assert s is not None
        assert (s.samples, s.attempts, s.verify_failures) == (9, 10, 1)
        assert s.mean_log_speedup == pytest.approx(sum(logs) / 9, rel=1e-9)
        mean = sum(logs) / 9
        assert s.m2_log_speedup == pytest.approx(sum((x - mean) ** 2 for x in logs), rel=1e-7)
    (tr,) = KBStore.open(a).transitions(STATE)
    assert tr.count == 3 + 4  # 3 shared moves once, 4 of b's own
    assert KBStore.open(a).stats().outcomes == {"faster": 9, "incorrect": 1}

    # merging the same file again adds nothing
    before = KBStore.open(a).snapshot()
    again = merge_kb(KBStore.open(a), b, update)
    assert again.outcomes_added == 0 and again.scores_pooled == 0 and again.transitions_added == 0
    after = KBStore.open(a).snapshot()
    assert after["scores"] == before["scores"] and after["transitions"] == before["transitions"]


def test_merge_refuses_foreign_files(tmp_path: Path) -> None:
    bad = tmp_path / "other.json"
    bad.write_text('{"_default": {}}')
    with pytest.raises(InterchangeError, match="not a kb-mcp KB"):
        merge_kb(KBStore.open(tmp_path / "a.json"), bad, update)
    with pytest.raises(InterchangeError, match="no such file"):
        merge_kb(KBStore.open(tmp_path / "a.json"), tmp_path / "missing.json", update)


NEW_OPT = "grid_stride_ilp"  # an optimization this KB has no hopper score for
WHEN = "2026-01-01T00:00:00+00:00"


def _row(mean: object = 0.5, m2: object = 0.0, samples: object = 1, *, weight: object = 1.0,
         clients: object = None) -> list[object]:
    """A stats row of the file layout (kb.tables): mean, m2, samples, attempts, successes, compile and
    verify failures, updated_at, weight, ok_weight, fail_weight, clients, run."""
    return [mean, m2, samples, samples, samples, 0, 0, WHEN, weight, weight, 0.0,
            {"c": [weight, mean, m2]} if clients is None else clients, None]


def _other_file(kb: Path, dest: Path) -> dict:
    """`kb` exported to `dest` and read back, its outcomes left out (so none of its history is shared)."""
    export_kb(KBStore.open(kb), dest)
    data: dict = json.loads(dest.read_text())
    data["outcomes"] = {}
    return data


def _with_score(data: dict, row: list[object] | None, prior: tuple[float, float] = (0.0, 1.0)) -> None:
    """A score document for STATE on hopper holding NEW_OPT's prior and (unless None) its stats row."""
    data["scores"]["9999"] = {"state_id": STATE, "arch": "hopper", "updated_at": WHEN, "priors": {NEW_OPT: list(prior)},
                              "stats": {} if row is None else {NEW_OPT: row}}


def _kb_bytes(kb: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(kb.parent.iterdir()) if p.name.startswith(kb.name)}


BAD_SCORES = {
    "a client's mean NaN": _row(clients={"mallory": [1.0, float("nan"), 0.0]}),
    "an infinite mean": _row(mean=float("inf")),
    "a string mean": _row(mean="x"),
    "a negative m2": _row(m2=-1.0),
    "a negative weight": _row(weight=-3.0, clients={}),
    "a fractional count": _row(samples=1.5),
    "a negative count": _row(samples=-2),
    "a client entry of two numbers": _row(clients={"mallory": [1.0, 0.5]}),
    "a client of negative weight": _row(clients={"mallory": [-1.0, 0.5, 0.0]}),
    "a row too short": [0.5, 0.0],
    "a prior weight NaN": None,
    "a client's failures NaN": [*_row(), {"mallory": [1.0, float("nan")]}],
    "a client's successes negative": [*_row(), {"mallory": [-5.0, 0.0]}],
    "a client's rates of three numbers": [*_row(), {"mallory": [1.0, 0.0, 2.0]}],
}


NOT_JSON = {"a client's mean NaN", "an infinite mean", "a prior weight NaN", "a client's failures NaN"}


@pytest.mark.parametrize("case", sorted(BAD_SCORES))
def test_merge_refuses_a_file_with_a_bad_score_row_and_leaves_this_kb_unchanged(tmp_path: Path, case: str) -> None:
    kb, other = tmp_path / "kb.json", tmp_path / "other.json"
    _record(kb, "c_1", 1.0)
    data = _other_file(kb, other)
    row = BAD_SCORES[case]
    _with_score(data, row, prior=(0.0, float("nan")) if row is None else (0.0, 1.0))
    other.write_text(json.dumps(data))  # json writes NaN and Infinity, and reads them back
    store = KBStore.open(kb)
    before = _kb_bytes(kb)

    with pytest.raises(InterchangeError) as refused:
        merge_kb(store, other, update)

    msg = str(refused.value)
    assert str(other) in msg and "unchanged" in msg
    if case in NOT_JSON:  # refused as the file is read, naming where it stands
        assert f"is not a JSON number (at scores/9999/{'priors' if row is None else 'stats'}/{NEW_OPT}/" in msg
    else:
        assert f"state {STATE!r}" in msg and f"optimization {NEW_OPT!r}" in msg
        assert "arch 'hopper'" in msg and "track 'fp32'" in msg
    assert _kb_bytes(kb) == before
    res = so.run(ToolContext(kb, client_name="reader"), so.Request(state_id=STATE, k=3, arch="sm_90"))
    assert all(math.isfinite(x.expected_speedup) for x in res.suggestions)


def test_a_nan_in_a_score_this_kb_also_holds_is_refused_before_it_reaches_the_calibration(tmp_path: Path) -> None:
    kb, other = tmp_path / "kb.json", tmp_path / "other.json"
    for cid in ("c_1", "c_2", "c_3"):
        _record(kb, cid, 1.0)
    data = _other_file(kb, other)
    for doc in data["scores"].values():  # every score of STATE/OPT, the pooled one (calibration) included
        if doc["state_id"] == STATE and OPT in doc["stats"]:
            row = doc["stats"][OPT]
            row[2], row[3] = row[2] + 1, row[3] + 1
            row[11] = {"mallory": [1.0, float("nan"), 0.0]}
    other.write_text(json.dumps(data))
    store = KBStore.open(kb)
    before = _kb_bytes(kb)

    with pytest.raises(InterchangeError, match=rf"NaN is not a JSON number \(at scores/\d+/stats/{OPT}/11/mallory/1\)"):
        merge_kb(store, other, update)

    assert _kb_bytes(kb) == before
    mine = KBStore.open(kb).get_score(STATE, OPT, ALL_ARCH)
    assert mine is not None and mine.samples == 3 and math.isfinite(mine.mean_log_speedup)
    res = so.run(ToolContext(kb, client_name="reader"), so.Request(state_id="compute_throughput_saturated", k=3))
    assert res.suggestions and all(math.isfinite(x.expected_speedup) for x in res.suggestions)


def test_merge_refuses_a_file_whose_other_records_break_their_models(tmp_path: Path) -> None:
    kb, other = tmp_path / "kb.json", tmp_path / "other.json"
    _record(kb, "c_1", 1.0, next_state="compute_throughput_saturated")
    exported = json.loads(export_kb(KBStore.open(kb), tmp_path / "copy.json").read_text())
    lesson = {"id": "l_1", "state_id": STATE, "optimization_id": OPT}  # no text
    transition = {"state_id": STATE, "optimization_id": OPT, "next_state_id": "x", "count": -5}
    breaks = {
        "lesson 'l_1'": ("lessons", lesson, "text"),
        "transition": ("transitions", transition, "count"),
        "damaged": ("outcomes", None, "NaN is not a JSON number (at outcomes/1/speedup)"),
        "damaged: not valid JSON": ("candidates", None, "NaN is not a JSON number (at candidates/1/time_ms)"),
    }
    store = KBStore.open(kb)
    before = _kb_bytes(kb)
    for what, (table, doc, why) in breaks.items():
        data = json.loads(json.dumps(exported))
        if doc is None:  # the one record already there, with a NaN
            (doc,) = data[table].values()
            doc[why.rstrip(")").rsplit("/", 1)[1]] = float("nan")
        else:
            data[table]["99"] = doc
        other.write_text(json.dumps(data))
        with pytest.raises(InterchangeError, match=f"{other}: {what}") as refused:
            merge_kb(store, other, update)
        assert why in str(refused.value) and "unchanged" in str(refused.value)
        assert _kb_bytes(kb) == before


def test_a_score_merged_where_this_kb_has_none_is_held_within_the_bounds_of_its_own(tmp_path: Path) -> None:
    kb, other = tmp_path / "kb.json", tmp_path / "other.json"
    KBStore.open(kb)
    data = _other_file(kb, other)
    claimed = math.log(1e6)
    _with_score(data, _row(mean=claimed, m2=1e12, samples=1000, weight=1000.0,
                           clients={"mallory": [1000.0, claimed, 1e12], "eve": [900.0, claimed, 0.0]}),
                prior=(math.log(1e9), 1e6))
    other.write_text(json.dumps(data))

    report = merge_kb(KBStore.open(kb), other, update)

    assert report.scores_added >= 1
    s = KBStore.open(kb).get_score(STATE, NEW_OPT, "hopper")
    assert s is not None and s.samples == 1000  # the counters say what was claimed
    assert all(w <= CLIENT_MAX_WEIGHT for w, _, _ in s.clients.values()) and s.weight <= MAX_WEIGHT
    assert s.mean_log_speedup <= math.log(interchange.SPEEDUP_RANGE[1]) + 1e-9
    assert s.m2_log_speedup <= s.weight * math.log(2000.0) ** 2 / 4 + 1e-9
    assert s.prior_weight <= interchange.MAX_PRIOR_WEIGHT
    assert s.prior_mean_log_speedup <= math.log(interchange.SPEEDUP_RANGE[1]) + 1e-9


def test_a_file_claims_no_more_moves_between_states_than_its_outcomes_made(tmp_path: Path) -> None:
    theirs, other, kb = tmp_path / "theirs.json", tmp_path / "other.json", tmp_path / "kb.json"
    _record(theirs, "c_1", 1.0, next_state="compute_throughput_saturated")
    export_kb(KBStore.open(theirs), other)
    data = json.loads(other.read_text())
    (move,) = data["transitions"].values()
    move["count"] = 10**12  # one outcome made it; the file says a trillion did
    other.write_text(json.dumps(data))
    KBStore.open(kb)

    report = merge_kb(KBStore.open(kb), other, update)

    (merged,) = KBStore.open(kb).transitions(STATE)
    assert merged.count == 1 and report.transitions_added == 1


OTHER_OPT, NEXT = "fuse_elementwise_chain", "compute_throughput_saturated"


def _credit_again(kb: Path, cid: str, opt: str) -> None:
    """What a file written before a candidate's credit was held by one outcome could hold: the
    candidate's outcome recorded again for `opt` (later), with its score, transition and lesson."""
    with KBStore.open(kb).transaction() as tx:
        (first,) = tx.outcomes_for_candidate(cid)
        again = first.model_copy(update={"id": ids.outcome_id(cid, opt), "optimization_id": opt,
                                         "created_at": first.created_at + timedelta(seconds=1)})
        tx.put_outcome(again)
        for arch in ("hopper", ALL_ARCH):
            base = tx.get_score(STATE, opt, arch) or Score(state_id=STATE, optimization_id=opt, arch=arch)
            tx.put_score(update.apply_outcome(base, again.verdict, again.speedup, client=again.agent))
        tx.bump_transition(STATE, opt, NEXT)
        text = "Fusing helped here as well."
        tx.put_lesson(Lesson(id=ids.lesson_id(STATE, opt, text), state_id=STATE, optimization_id=opt, arch="hopper",
                             text=text, source="agent", author=again.agent, candidate_id=cid, outcome_id=again.id))


def _measured(kb: Path, opt: str) -> list[int]:
    """Samples of `opt`'s hopper and pooled scores in STATE (0 where there is none)."""
    scores = [KBStore.open(kb).get_score(STATE, opt, arch) for arch in ("hopper", ALL_ARCH)]
    return [s.samples if s is not None else 0 for s in scores]


def test_a_merged_file_credits_a_candidate_to_its_first_outcome_only(tmp_path: Path) -> None:
    theirs, kb = tmp_path / "theirs.json", tmp_path / "kb.json"
    _record(theirs, "c_1", 1.0, next_state=NEXT)
    _credit_again(theirs, "c_1", OTHER_OPT)
    assert _measured(theirs, OTHER_OPT) == [1, 1]
    KBStore.open(kb)

    report = merge_kb(KBStore.open(kb), theirs, update)

    assert report.outcomes_added == 1 and report.outcomes_left_out == 1
    assert _measured(kb, OPT) == [1, 1] and _measured(kb, OTHER_OPT) == [0, 0]
    assert [(t.optimization_id, t.count) for t in KBStore.open(kb).transitions(STATE)] == [(OPT, 1)]
    assert KBStore.open(kb).lessons(STATE, OTHER_OPT) == []


def test_a_merged_outcome_of_a_candidate_this_kb_credited_elsewhere_moves_nothing(tmp_path: Path) -> None:
    theirs, kb = tmp_path / "theirs.json", tmp_path / "kb.json"
    _record(kb, "c_1", 1.0, next_state=NEXT)
    _record(theirs, "c_1", 1.0, next_state=NEXT, opt=OTHER_OPT)  # the same kernel, credited to another there
    before = KBStore.open(kb).snapshot()

    report = merge_kb(KBStore.open(kb), theirs, update)

    assert report.outcomes_added == 0 and report.outcomes_left_out == 1
    assert _measured(kb, OTHER_OPT) == [0, 0]
    after = KBStore.open(kb).snapshot()
    assert after["outcomes"] == before["outcomes"] and after["transitions"] == before["transitions"]


def test_reference_import_round_trip(tmp_path: Path) -> None:
    original = json.loads(SAMPLE.read_text())
    store = KBStore.open(tmp_path / "a.json")
    report = import_reference(store, original, source=str(SAMPLE))
    assert report.states_added == 2 and report.optimizations_added == 4 and report.scores_added == 5
    assert any("implementation_notes" in line for line in report.ignored)
    gather = store.get_state("bandwidth_bound_gather")
    assert gather is not None and gather.origin == "imported" and gather.signature.key == "memory/uncoalesced_access"
    tail = store.get_state("tail_effect_small_grid")
    assert tail is not None and tail.origin == "discovered" and tail.signature.key == "latency/too_few_blocks"

    with store.read() as view:
        exported = export_reference(view, ["memory_bandwidth_saturated", "bandwidth_bound_gather",
                                           "tail_effect_small_grid"])
    sections = {**exported["optimization_strategies"], **exported["discovered_states"]}
    assert set(exported["discovered_states"]) == {"tail_effect_small_grid"}
    for group in ("optimization_strategies", "discovered_states"):
        for name, entry in original[group].items():
            out = sections[name]
            assert out["primary_bottleneck"] == entry["primary_bottleneck"]
            assert out["secondary_characteristics"][0] == entry["secondary_characteristics"][0]
            by_technique = {o["technique"]: o for o in out["optimizations"]}
            for o in entry["optimizations"]:
                got = by_technique[o["technique"]]
                assert (got["description"], got["category"]) == (o["description"], o["category"])
                assert got["predicted_speedup"] == pytest.approx(o["predicted_speedup"], abs=1e-4)
                assert got["confidence_score"] == pytest.approx(o["confidence_score"], abs=1e-4)

    # and the exported file imports into a fresh KB as the same records
    fresh = KBStore.open(tmp_path / "b.json")
    import_reference(fresh, json.loads(json.dumps(exported)))
    for sid in ("bandwidth_bound_gather", "tail_effect_small_grid"):
        a_state, b_state = store.get_state(sid), fresh.get_state(sid)
        assert a_state is not None and b_state is not None
        assert (a_state.name, a_state.signature, a_state.origin) == (b_state.name, b_state.signature, b_state.origin)
    for sid in ("memory_bandwidth_saturated", "bandwidth_bound_gather", "tail_effect_small_grid"):
        with store.read() as va, fresh.read() as vb:
            a_scores = {s.optimization_id: s for s in va.scores(sid)}
            b_scores = {s.optimization_id: s for s in vb.scores(sid)}
        assert a_scores.keys() == b_scores.keys()
        for k, s in a_scores.items():
            assert b_scores[k].prior_mean_log_speedup == pytest.approx(s.prior_mean_log_speedup, abs=1e-4)
            assert b_scores[k].prior_weight == pytest.approx(s.prior_weight, abs=1e-3)


def test_reference_import_rejects_other_shapes(kb_path: Path) -> None:
    with pytest.raises(InterchangeError, match="optimization_strategies"):
        import_reference(KBStore.open(kb_path), {"states": []})
    assert interchange.detect_format([1]) == ""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_end_to_end(tmp_path: Path) -> None:
    kb = tmp_path / "k.json"
    r = _cli("--kb", str(kb), "kb", "stats")
    assert r.returncode == 3 and "kb init" in r.stderr and "Traceback" not in r.stderr  # 3: the environment's
    assert not kb.exists()
    r = _cli("--kb", str(kb), "kb", "init")
    assert r.returncode == 0 and "created and seeded" in r.stdout and "23 states" in r.stdout
    r = _cli("--kb", str(kb), "kb", "stats")
    assert r.returncode == 0 and "optimizations" in r.stdout and "75" in r.stdout
    r = _cli("--kb", str(kb), "kb", "show", "memory_bandwidth_saturated", "--arch", "sm_90")
    assert r.returncode == 0 and "flash_attention_tiling" in r.stdout and "x2.00" in r.stdout
    r = _cli("--kb", str(kb), "kb", "show", "memory_bandwith")
    assert r.returncode == 1 and "did you mean memory_bandwidth_saturated" in r.stderr and "Traceback" not in r.stderr
    r = _cli("--kb", str(kb), "kb", "import", str(SAMPLE))
    assert r.returncode == 0 and "+2 states" in r.stdout
    r = _cli("--kb", str(kb), "kb", "export", str(tmp_path / "out.json"))
    assert r.returncode == 0 and (tmp_path / "out.json").exists()
    r = _cli("--kb", str(kb), "kb", "export", str(tmp_path / "out.json"))
    assert r.returncode == 1 and "exists" in r.stderr and "--force" in r.stderr
    r = _cli("--kb", str(kb), "kb", "export", str(tmp_path / "out.json"), "--force")
    assert r.returncode == 0
    r = _cli("--kb", str(kb), "kb", "export", str(tmp_path / "ref.json"), "--format", "reference")
    assert r.returncode == 0
    assert "bandwidth_bound_gather" in json.loads((tmp_path / "ref.json").read_text())["optimization_strategies"]
    r = _cli("--kb", str(tmp_path / "k2.json"), "kb", "merge", str(tmp_path / "out.json"), str(SAMPLE))
    assert r.returncode == 0 and r.stdout.count("(kb-mcp)") == 1 and "(reference)" in r.stdout
    (tmp_path / "bad.json").write_text("{")
    r = _cli("--kb", str(kb), "kb", "import", str(tmp_path / "bad.json"))
    assert r.returncode == 1 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("not a kb")
    r = _cli("--kb", str(corrupt), "kb", "stats")
    assert r.returncode == 3 and str(corrupt) in r.stderr and corrupt.read_text() == "not a kb"


def _limit_file_size() -> None:
    # exports are ~100 KB: a write past 20 KB fails with EFBIG, as on a full quota, part way through
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))


@pytest.mark.parametrize("fmt", ["kb-mcp", "reference"])
def test_an_export_that_fails_part_way_is_the_environments_and_leaves_the_old_file(tmp_path: Path, fmt: str) -> None:
    kb, dest = tmp_path / "k.json", tmp_path / "out.json"
    KBStore.open(kb)
    dest.write_text("the export before\n")
    r = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb), "kb", "export", str(dest),
                        "--format", fmt, "--force"], capture_output=True, text=True, timeout=120,
                       preexec_fn=_limit_file_size)
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    assert f"cannot write the export {dest}: File too large" in r.stderr and "ulimit -f" in r.stderr
    assert dest.read_text() == "the export before\n"  # whole or not at all
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out.json")) == []  # no temp file left


@pytest.mark.parametrize("fmt", ["kb-mcp", "reference"])
def test_an_export_to_a_directory_is_the_callers_mistake(tmp_path: Path, fmt: str) -> None:
    kb = tmp_path / "k.json"
    KBStore.open(kb)
    (tmp_path / "folder").mkdir()
    r = _cli("--kb", str(kb), "kb", "export", str(tmp_path / "folder"), "--format", fmt, "--force")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "is a directory; name the file to write" in r.stderr and not any((tmp_path / "folder").iterdir())


def test_cli_merge_of_a_damaged_kb_file_names_the_record_and_changes_nothing(tmp_path: Path) -> None:
    kb, other = tmp_path / "k.json", tmp_path / "other.json"
    KBStore.open(kb)
    data = _other_file(kb, other)
    _with_score(data, _row(mean="x"))
    other.write_text(json.dumps(data))
    before = _kb_bytes(kb)
    r = _cli("--kb", str(kb), "kb", "merge", str(other))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(other) in r.stderr and NEW_OPT in r.stderr and "mean_log_speedup" in r.stderr
    assert _kb_bytes(kb) == before
    data["scores"]["9999"]["stats"][NEW_OPT] = _row(mean=float("nan"))
    other.write_text(json.dumps(data))
    r = _cli("--kb", str(kb), "kb", "import", str(other))
    assert r.returncode == 1 and "NaN is not a JSON number" in r.stderr and "Traceback" not in r.stderr
    assert _kb_bytes(kb) == before


def test_merging_a_kb_holding_a_newer_kb_mcp_line_refuses_with_upgrade_words_and_changes_neither(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other.json"
    with KBStore.open(other).transaction() as tx:
        tx.put_candidate(CandidateRecord(candidate_id="c_1", problem="p", problem_hash="h", verdict=Verdict.faster,
                                         arch="sm_90", time_ms=1.0, eager_ms=2.0))
    j = tmp_path / "other.json.journal"
    data = j.read_bytes()
    j.write_bytes(data + journal.encode(journal.Entry(2, [["frobnicate", "candidates", "c_1"]], len(data))))
    written, mine = j.read_bytes(), tmp_path / "mine.json"
    KBStore.open(mine)
    mine_before = mine.read_bytes()
    r = _cli("--kb", str(mine), "kb", "merge", str(other))
    said = " ".join(r.stderr.split())
    assert r.returncode == 3 and "frobnicate" in said and str(j) in said, r.stdout + r.stderr
    assert "upgrade kb-mcp on this machine" in said.lower() and "Traceback" not in said
    assert j.read_bytes() == written and mine.read_bytes() == mine_before
