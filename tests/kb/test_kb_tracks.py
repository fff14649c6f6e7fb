"""Precision tracks in the score key: files written before tracks existed read as fp32, an outcome
moves only its verdict's track, selection reads only the requested track's measurements (with the
pooled `*` fallback inside the track), and merging pools per track."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kb_mcp.kb.interchange import export_kb, merge_kb
from kb_mcp.kb.models import ALL_ARCH, CandidateRecord, Track, Verdict
from kb_mcp.kb.store import KBFileError, KBStore
from kb_mcp.kb.tables import Tables
from kb_mcp.policy import update
from kb_mcp.tools import record_outcome as ro
from kb_mcp.tools import suggest_optimizations as so
from kb_mcp.tools.context import ToolContext

STATE, OPT = "memory_bandwidth_saturated", "vectorize_global_access"


def _verdict(ctx: ToolContext, cid: str, *, track: Track = Track.fp32, time_ms: float = 1.0,
             arch: str = "sm_90") -> None:
    with ctx.store.transaction() as tx:
        tx.put_candidate(CandidateRecord(candidate_id=cid, problem="p", problem_hash="h", verdict=Verdict.faster,
                                         track=track, arch=arch, device=arch, time_ms=time_ms, eager_ms=2.0))


def _record(ctx: ToolContext, cid: str, opt: str = OPT) -> ro.Result:
    return ro.run(ctx, ro.Request(state_id=STATE, optimization_id=opt, candidate_id=cid))


def _old_layout_file(path: Path) -> None:
    """A KB file as written before tracks existed: score documents carry no "track"."""
    ctx = ToolContext(path, client_name="t")
    _verdict(ctx, "c_old", time_ms=0.5)
    _record(ctx, "c_old")
    export_kb(ctx.store, path.with_name("folded.json"))
    data = json.loads(path.with_name("folded.json").read_text())
    assert all("track" not in doc for doc in data["scores"].values()), "fp32 documents are written without a track"
    data["meta"]["1"]["applied_seq"] = 0
    path.with_name("folded.json").unlink()
    Path(str(path) + ".journal").unlink(missing_ok=True)
    path.write_text(json.dumps(data))


def test_a_file_without_tracks_reads_as_fp32_and_keeps_working(kb_path: Path) -> None:
    _old_layout_file(kb_path)
    before = kb_path.read_bytes()
    store = KBStore.open(kb_path)
    assert kb_path.read_bytes() == before, "opening an old file rewrites nothing"
    score = store.get_score(STATE, OPT, "hopper")
    assert score is not None and score.track == Track.fp32 and score.samples == 1
    assert store.get_score(STATE, OPT, "hopper", "bf16") is None
    assert store.stats().tracks == ["fp32"]
    ctx = ToolContext(kb_path, client_name="t")
    _verdict(ctx, "c_new", time_ms=0.8)
    assert _record(ctx, "c_new").entry.samples == 2  # the old statistics go on growing


def test_a_journal_line_without_a_track_replays_as_fp32() -> None:
    t = Tables()
    t.replay([
        ["score", STATE, "hopper", OPT, [0.1, 1.0], [0.5, 0.0, 1, 1, 1, 0, 0, "2024-01-01T00:00:00+00:00"],
         "2024-01-01T00:00:00+00:00"],
        ["score", STATE, "hopper", OPT, [0.1, 1.0], None, "2024-01-01T00:00:00+00:00", "bf16"],
    ])
    assert set(t.scores) == {(STATE, "hopper", "fp32"), (STATE, "hopper", "bf16")}
    assert OPT in t.scores[(STATE, "hopper", "fp32")]["stats"]
    assert OPT not in t.scores[(STATE, "hopper", "bf16")]["stats"]  # a pure prior on bf16


def test_an_unknown_track_in_a_file_is_refused_by_name(kb_path: Path) -> None:
    _old_layout_file(kb_path)
    data = json.loads(kb_path.read_text())
    next(iter(data["scores"].values()))["track"] = "fp8"
    kb_path.write_text(json.dumps(data))
    with pytest.raises(KBFileError, match="fp8"):
        KBStore.open(kb_path)


def test_an_outcome_moves_only_its_verdicts_track(kb_path: Path) -> None:
    ctx = ToolContext(kb_path, client_name="t")
    _verdict(ctx, "c_b", track=Track.bf16, time_ms=0.5)
    res = _record(ctx, "c_b")
    assert res.track == Track.bf16 and res.entry.track == Track.bf16 and res.entry.samples == 1
    out = ctx.store.get_outcome(res.outcome_id)
    assert out is not None and out.track == Track.bf16
    for arch in ("hopper", ALL_ARCH):
        bf16 = ctx.store.get_score(STATE, OPT, arch, "bf16")
        assert bf16 is not None and bf16.samples == 1
        # the bf16 score starts from the strict track's prior, not from nothing
        assert bf16.prior_mean_log_speedup == ctx.store.get_score(STATE, OPT, ALL_ARCH).prior_mean_log_speedup  # type: ignore[union-attr]
    fp32 = ctx.store.get_score(STATE, OPT, ALL_ARCH)
    assert fp32 is not None and fp32.samples == 0 and fp32.prior
    assert ctx.store.get_score(STATE, OPT, "hopper") is None
    assert sorted(ctx.store.stats().tracks) == ["bf16", "fp32"]


def test_selection_reads_only_the_requested_tracks_measurements(kb_path: Path) -> None:
    ctx = ToolContext(kb_path, client_name="t")
    for i in range(5):  # a clear winner measured on bf16, on hopper
        _verdict(ctx, f"c_{i}", track=Track.bf16, time_ms=0.25)
        _record(ctx, f"c_{i}")
    bf16 = so.run(ctx, so.Request(state_id=STATE, arch="sm_90", track=Track.bf16, k=10, temperature=0.0))
    top = bf16.suggestions[0]
    assert bf16.track == Track.bf16 and top.id == OPT and top.samples == 5 and top.scored_on == "hopper"
    # every fp32 optimization is there on bf16 too, on its prior
    fp32_all = so.run(ctx, so.Request(state_id=STATE, k=10, temperature=0.0))
    assert bf16.candidates == fp32_all.candidates
    assert all(s.samples == 0 for s in bf16.suggestions[1:])
    # another arch family falls back to the pooled bf16 score
    ampere = so.run(ctx, so.Request(state_id=STATE, arch="sm_80", track=Track.bf16, k=1, temperature=0.0))
    assert ampere.suggestions[0].id == OPT and ampere.suggestions[0].scored_on == ALL_ARCH
    # the strict track has seen none of it
    strict = so.run(ctx, so.Request(state_id=STATE, arch="sm_90", k=10, temperature=0.0))
    assert all(s.samples == 0 for s in strict.suggestions)
    strict_opt = next(s for s in ctx.store.candidates(STATE, "hopper") if s.optimization_id == OPT)
    assert strict_opt.prior and strict_opt.expected_speedup < top.expected_speedup


def test_merge_pools_within_each_track(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    ca, cb = ToolContext(a, client_name="a"), ToolContext(b, client_name="b")
    _verdict(ca, "c_shared", track=Track.fp16, time_ms=1.25)
    _record(ca, "c_shared")
    export_kb(ca.store, b)
    _verdict(cb, "c_b1", track=Track.fp16, time_ms=1.5)
    _record(cb, "c_b1")
    _verdict(cb, "c_b2", track=Track.fp32, time_ms=1.0)
    _record(cb, "c_b2")
    merge_kb(KBStore.open(a), b, update)
    fp16 = KBStore.open(a).get_score(STATE, OPT, "hopper", "fp16")
    assert fp16 is not None and fp16.samples == 2  # the shared outcome counted once
    assert fp16.mean_log_speedup == pytest.approx((math.log(2.0 / 1.25) + math.log(2.0 / 1.5)) / 2)
    fp32 = KBStore.open(a).get_score(STATE, OPT, "hopper")
    assert fp32 is not None and fp32.samples == 1 and fp32.mean_log_speedup == pytest.approx(math.log(2.0))


def test_the_track_change_detector_is_kept_per_track_and_family_and_old_files_read_as_quiet(kb_path: Path) -> None:
    ctx = ToolContext(kb_path, client_name="t")
    with ctx.store.read() as view:
        assert view.track_alarm(Track.fp32, "hopper") == 0.0, "no stored level: quiet"
        opts = sorted(s.optimization_id for s in view.candidates(STATE, "hopper"))[:4]
    for i, opt in enumerate(opts):  # many scores far below their estimates at once: the track is alarmed
        _verdict(ctx, f"c_slow{i}", time_ms=16.0)
        _record(ctx, f"c_slow{i}", opt)
    reopened = KBStore.open(kb_path)
    with reopened.read() as view:
        assert update.track_alarmed(view.track_alarm(Track.fp32, "hopper")), "kept in the file"
        assert view.track_alarm(Track.bf16, "hopper") == 0.0 and view.track_alarm(Track.fp32, "ampere") == 0.0
