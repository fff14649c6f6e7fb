"""Export, import and merge of KB files, the reference shape round trip, and the `kb` CLI."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from kb_mcp.kb import interchange
from kb_mcp.kb.interchange import InterchangeError, export_kb, export_reference, import_reference, merge_kb
from kb_mcp.kb.models import ALL_ARCH, CandidateRecord, Verdict
from kb_mcp.kb.store import KBStore
from kb_mcp.policy import update
from kb_mcp.tools import record_outcome as ro
from kb_mcp.tools.context import ToolContext

SAMPLE = Path(__file__).with_name("data") / "reference_kb.json"
STATE, OPT = "memory_bandwidth_saturated", "vectorize_global_access"


def _record(kb: Path, cid: str, time_ms: float, *, verdict: Verdict = Verdict.faster,
            next_state: str | None = None) -> None:
    ctx = ToolContext(kb, client_name=f"agent-{cid}")  # one client per record: no per-client bound applies
    with ctx.store.transaction() as tx:
        tx.put_candidate(CandidateRecord(candidate_id=cid, problem="p", problem_hash="h", verdict=verdict, arch="sm_90",
                                         time_ms=time_ms, eager_ms=2.0))
    ro.run(ctx, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=cid, next_state_id=next_state))


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
