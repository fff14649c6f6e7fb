"""The sources, reports and verdicts kept of verified candidates (tools.candidate_store): each client
keeps at most its newest few that nothing needs, and never loses one an outcome names, one another
client verified too, one a composition takes; another client's stay, and so do verdicts merged in
from another KB file. Real KB files (their bytes measured), the real tools (a real compile-only check
with nvcc), a real decomposition, the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kb_mcp.harness.judgment.findings import Timings
from kb_mcp.harness.judgment.verdict import CompileResult, InputSetCheck, VerifyResult
from kb_mcp.harness.problem import Problem, candidate_id, load_problem, parse_problem
from kb_mcp.kb.errors import SettingError
from kb_mcp.kb.interchange import merge_kb
from kb_mcp.kb.models import Lesson, Verdict
from kb_mcp.kb.store import KBStore
from kb_mcp.policy import update
from kb_mcp.server import gc, kb_views
from kb_mcp.tools import candidate_store, compile_and_verify, decompose_problem
from kb_mcp.tools import record_outcome as ro
from kb_mcp.tools import suggest_optimizations as so
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext

ROOT = Path(__file__).resolve().parents[2]
SWISH = ROOT / "examples" / "problems" / "swish.py"
PROBLEM = load_problem(str(SWISH))
NVRTC = (ROOT / "examples" / "candidates" / "swish_nvrtc.py").read_text()
STATE, OPT = "memory_bandwidth_saturated", "fuse_elementwise_chain"
KEEP = 2


@pytest.fixture(autouse=True)
def _bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(candidate_store.ENV_CANDIDATES_KEPT_PER_CLIENT, str(KEEP))


@pytest.fixture
def clients(kb_path: Path) -> Iterator[tuple[ToolContext, ToolContext]]:
    alice, bob = ToolContext(kb_path, client_name="alice"), ToolContext(kb_path, client_name="bob")
    yield alice, bob
    alice.close()
    bob.close()


def _store(ctx: ToolContext, source: str, verdict: Verdict = Verdict.needs_gpu, problem: Problem = PROBLEM) -> str:
    """Stores `ctx`'s verdict on a candidate through compile_and_verify's own `record`, as a verification
    does (a GPU's timings for a valid verdict); returns its candidate_id."""
    valid = verdict.is_valid
    cid = candidate_id(problem, source)
    timings = Timings(candidate_ms=1.0, candidate_min_ms=1.0, candidate_host_ms=1.0, runs=10, eager_ms=2.0,
                      speedup_vs_baseline=2.0) if valid else None
    result = VerifyResult(
        candidate_id=cid, problem=problem.name, problem_hash=problem.hash, verdict=verdict, summary=verdict.value,
        compile=CompileResult(ok=True),
        input_sets=[InputSetCheck(index=0, kind="secret", passed=True)] if valid else [],
        device="NVIDIA H100 80GB HBM3" if valid else "", arch="sm_90" if valid else "", timings=timings,
    )
    request = compile_and_verify.Request(problem=problem.source, candidate=source)
    compile_and_verify.record(ctx, request, problem, source, result)
    return cid


def _kept(ctx: ToolContext) -> set[str]:
    """The candidates whose source is kept."""
    return {p.name.removesuffix(".py") for p in ctx.candidates_dir.glob("c_*.py")}


def _verdicts(ctx: ToolContext) -> set[str]:
    """The candidates the KB holds a verdict on, read afresh from the file by another store."""
    with KBStore.open(ctx.kb_path).read() as view:
        return {r.candidate_id for r in view.list_candidates()}


def _kb_bytes(ctx: ToolContext) -> int:
    """The KB file's size once its journal is folded into it (what every server loads)."""
    ctx.store.compact()
    return ctx.kb_path.stat().st_size


def _flood(ctx: ToolContext, tag: str, n: int = KEEP + 2) -> list[str]:
    return [_store(ctx, f"# {tag} {i}\n{NVRTC}") for i in range(n)]


@pytest.mark.nvcc
def test_a_client_checking_more_compile_only_candidates_than_its_bound_keeps_only_its_newest(
        clients: tuple[ToolContext, ToolContext]) -> None:
    alice, _ = clients
    ids = []
    for i in range(KEEP + 2):
        got = compile_and_verify.run(alice, compile_and_verify.Request(problem=str(SWISH),
                                                                       candidate=f"# variant {i}\n{NVRTC}"))
        assert got.record.verdict == Verdict.needs_gpu and got.compile.ok, got.summary
        ids.append(got.record.candidate_id)
    assert _kept(alice) == set(ids[-KEEP:])
    names = {p.name.split(".")[0] for p in alice.candidates_dir.iterdir()}
    assert names == set(ids[-KEEP:])  # the reports of the removed ones went with their sources
    assert _verdicts(alice) == set(ids[-KEEP:])  # and their verdicts left the KB


def test_a_source_an_outcome_names_survives_the_bound(clients: tuple[ToolContext, ToolContext]) -> None:
    alice, _ = clients
    parent = _store(alice, "# parent\n" + NVRTC)
    child = _store(alice, "# child\n" + NVRTC)
    ro.run(alice, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=child, parent_candidate_id=parent))
    flood = _flood(alice, "later")
    assert _kept(alice) == {parent, child, *flood[-KEEP:]}


def test_a_source_a_lesson_names_survives_the_bound_in_a_store_that_read_the_lesson_from_the_journal(
        clients: tuple[ToolContext, ToolContext]) -> None:
    alice, _ = clients
    taught = _store(alice, "# taught\n" + NVRTC)
    # another process's KB edit: alice's store learns of the lesson by replaying the journal
    with KBStore.open(alice.kb_path).transaction() as tx:
        tx.put_lesson(Lesson(id="l_taught", state_id=STATE, optimization_id=OPT, text="fuse it", candidate_id=taught))
    flood = _flood(alice, "later")
    assert _kept(alice) == {taught, *flood[-KEEP:]}
    assert _verdicts(alice) == {taught, *flood[-KEEP:]}


def test_another_clients_sources_are_untouched_by_a_clients_bound(clients: tuple[ToolContext, ToolContext]) -> None:
    alice, bob = clients
    bobs = _flood(bob, "bob", KEEP)
    alices = _flood(alice, "alice")
    assert _kept(alice) == {*bobs, *alices[-KEEP:]}


def test_a_candidate_two_clients_verified_survives_the_bound(clients: tuple[ToolContext, ToolContext]) -> None:
    alice, bob = clients
    shared = _store(alice, "# shared\n" + NVRTC)
    assert _store(bob, "# shared\n" + NVRTC) == shared
    alices = _flood(alice, "alice")
    assert _kept(alice) == {shared, *alices[-KEEP:]}


def test_a_bound_that_is_not_a_whole_number_above_0_is_refused_by_name(
        clients: tuple[ToolContext, ToolContext], monkeypatch: pytest.MonkeyPatch) -> None:
    alice, _ = clients
    monkeypatch.setenv(candidate_store.ENV_CANDIDATES_KEPT_PER_CLIENT, "0")
    with pytest.raises(SettingError, match=candidate_store.ENV_CANDIDATES_KEPT_PER_CLIENT):
        compile_and_verify.run(alice, compile_and_verify.Request(problem=str(SWISH), candidate=NVRTC))


MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def get_inputs():
    return [torch.randn(4, 32)]


def get_init_inputs():
    return [32, 64]
'''


def _flooded_part(alice: ToolContext, tmp_path: Path) -> tuple[decompose_problem.Request, str, str, list[str]]:
    """A model decomposed with `compose`, its relu part's own candidate stored `faster` (the one a
    composition takes), then more unneeded candidates of that part than alice keeps: (the request, the
    part's name, the best candidate, the flood)."""
    (tmp_path / "mlp.py").write_text(MODEL)
    req = decompose_problem.Request(problem=str(tmp_path / "mlp.py"), out_dir="parts", compose=True, verify=False)
    out = Path(decompose_problem.run(alice, req).out_dir)
    part_file = next(p for p in sorted((out / "parts").glob("part*.py")) if "relu" in p.read_text())
    part = parse_problem(part_file.read_text(), name=part_file.stem)
    own = part_file.read_text().replace("class Model(", "class ModelNew(").replace("torch.relu(", "torch.relu_(")
    best = _store(alice, own, Verdict.faster, part)
    flood = [_store(alice, f"# try {i}\n{own}", Verdict.needs_gpu, part) for i in range(KEEP + 2)]
    return req, part_file.stem, best, flood


def test_compose_still_finds_the_part_candidate_it_takes_after_the_bound(
        clients: tuple[ToolContext, ToolContext], tmp_path: Path) -> None:
    alice, _ = clients
    req, part_name, best, flood = _flooded_part(alice, tmp_path)
    assert _kept(alice) == {best, *flood[-KEEP:]}
    picks = {p.part: p for p in decompose_problem.run(alice, req).picks}
    assert picks[part_name].taken == "candidate" and picks[part_name].candidate_id == best


def test_a_removed_sources_candidate_page_says_it_was_removed_and_why(
        clients: tuple[ToolContext, ToolContext], tmp_path: Path) -> None:
    alice, _ = clients
    kept = _flood(alice, "page", KEEP)
    limits = gc.Retention(candidate_days=0)  # kb gc takes the unneeded sources; their verdicts stay
    gc.collect(gc.GcScope(store=alice.store, artifacts=alice.artifacts_dir, cache=tmp_path / "cache", limits=limits),
               [("unrecorded candidates", gc.unrecorded_candidates)])
    gone = kb_views.candidate_detail(alice.store, alice.candidates_dir, kept[0])
    assert gone is not None and gone.source is None and gone.record.candidate_id == kept[0]
    assert gone.source_removed and "no longer kept" in gone.source_removed
    assert candidate_store.ENV_CANDIDATES_KEPT_PER_CLIENT in gone.source_removed
    fresh = _store(alice, "# verified again\n" + NVRTC)
    shown = kb_views.candidate_detail(alice.store, alice.candidates_dir, fresh)
    assert shown is not None and shown.source and shown.source_removed is None


def test_the_page_of_a_candidate_removed_under_the_bound_says_so(clients: tuple[ToolContext, ToolContext]) -> None:
    alice, _ = clients
    first, *_ = _flood(alice, "page")
    assert kb_views.candidate_detail(alice.store, alice.candidates_dir, first) is None
    cli = [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(alice.kb_path), "kb", "candidate", first]
    got = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert got.returncode != 0 and "Traceback" not in got.stderr
    said = " ".join((got.stdout + got.stderr).split())
    assert "removed under the per-client bound" in said and candidate_store.ENV_CANDIDATES_KEPT_PER_CLIENT in said


def test_a_client_beyond_its_bound_keeps_only_its_newest_verdicts_and_the_kb_file_stops_growing(
        clients: tuple[ToolContext, ToolContext]) -> None:
    alice, _ = clients
    first = _flood(alice, "warm", KEEP + 5)
    before = _kb_bytes(alice)
    later = _flood(alice, "loop", 60)
    after = _kb_bytes(alice)
    assert _verdicts(alice) == set(later[-KEEP:])  # every options digest of the older ones went
    assert not set(first) & _verdicts(alice)
    # only the count of removed candidates grew (a few digits): 60 more verdicts would be ~30 KB
    assert after - before < 64, (before, after)
    stats = alice.store.stats()
    assert stats.candidates == KEEP and stats.candidates_removed == KEEP + 5 + 60 - KEEP


def test_every_options_digest_of_a_removed_candidate_goes(clients: tuple[ToolContext, ToolContext]) -> None:
    alice, _ = clients
    source = "# two digests\n" + NVRTC
    old = _store(alice, source)
    _store(alice, source, Verdict.faster)  # the same source on a GPU: a second verdict key
    with alice.store.read() as view:
        assert len(view.candidate_verdicts(old)) == 2
    best = _store(alice, "# newer and as fast\n" + NVRTC, Verdict.faster)  # what a composition takes now
    flood = _flood(alice, "after")
    assert _verdicts(alice) == {best, *flood[-KEEP:]}


def test_needed_candidates_keep_their_verdicts_beyond_the_bound(
        clients: tuple[ToolContext, ToolContext]) -> None:
    alice, bob = clients
    parent = _store(alice, "# parent\n" + NVRTC, Verdict.faster)
    child = _store(alice, "# child\n" + NVRTC, Verdict.faster)
    ro.run(alice, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=child, parent_candidate_id=parent))
    shared = _store(alice, "# shared\n" + NVRTC)
    _store(bob, "# shared\n" + NVRTC)
    bobs = _flood(bob, "bob", KEEP)
    flood = _flood(alice, "later")
    assert _verdicts(alice) == {parent, child, shared, *bobs, *flood[-KEEP:]}
    # the outcome still reads its candidate's and parent's verdicts: its lineage is whole
    with alice.store.read() as view:
        assert view.own_candidate(child) is not None and view.own_candidate(parent) is not None


def test_the_candidate_a_composition_takes_keeps_its_verdict(
        clients: tuple[ToolContext, ToolContext], tmp_path: Path) -> None:
    alice, _ = clients
    _, _, best, flood = _flooded_part(alice, tmp_path)
    assert _verdicts(alice) == {best, *flood[-KEEP:]}


def test_a_damaged_verdict_of_the_problem_is_never_taken_and_does_not_stop_the_bound(
        clients: tuple[ToolContext, ToolContext], tmp_path: Path) -> None:
    alice, _ = clients
    best = _store(alice, "# best\n" + NVRTC, Verdict.faster)
    with alice.store.read() as view:
        doc = view.get_candidate(best).model_dump(mode="json")  # type: ignore[union-attr]
    # another process's damaged record of the same problem, faster still: a KB file is untrusted
    damaged = {**doc, "candidate_id": "c_damaged", "speedup_vs_baseline": 50.0, "coverage": "most",
               "verified_by": ["carol"]}
    with KBStore.open(alice.kb_path).transaction() as tx:
        tx.replay([["put", "candidates", f"c_damaged/{doc['options_digest']}", damaged]])
    flood = _flood(alice, "after")
    assert _kept(alice) == {best, *flood[-KEEP:]}
    with KBStore.open(alice.kb_path).read() as view:
        assert {c for c in [best, *flood] if view.candidate_verdicts(c)} == {best, *flood[-KEEP:]}
        assert view.own_verdict_keys("c_damaged")  # another client's record stays, never taken
        picked = view.composed_verdict(PROBLEM.hash)
    assert picked is not None and picked.candidate_id == best


def test_verdicts_merged_in_from_another_kb_file_are_not_counted_against_a_client(
        clients: tuple[ToolContext, ToolContext], tmp_path: Path) -> None:
    alice, _ = clients
    other = ToolContext(tmp_path / "other" / "kb.json", client_name="alice")  # the same name, another KB
    try:
        merged = [_store(other, f"# theirs {i}\n{NVRTC}") for i in range(KEEP)]
    finally:
        other.close()
    merge_kb(alice.store, tmp_path / "other" / "kb.json", update)
    flood = _flood(alice, "mine")
    assert _verdicts(alice) == {*merged, *flood[-KEEP:]}


def test_recording_an_outcome_of_a_candidate_removed_under_the_bound_is_refused_saying_so(
        clients: tuple[ToolContext, ToolContext]) -> None:
    alice, _ = clients
    parent = _store(alice, "# parent\n" + NVRTC)
    old, *_ = _flood(alice, "old")
    with pytest.raises(ToolError) as refused:
        ro.run(alice, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=old))
    said = str(refused.value)
    assert old in said and "removed under the bound" in said and "Verify its source again" in said
    assert candidate_store.ENV_CANDIDATES_KEPT_PER_CLIENT in said
    assert parent not in _verdicts(alice)  # the would-be parent went too: refused the same way
    child = _store(alice, "# child\n" + NVRTC, Verdict.faster)
    with pytest.raises(ToolError, match="parent_candidate_id .*removed under the bound"):
        ro.run(alice, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=child, parent_candidate_id=parent))
    with pytest.raises(ToolError, match="removed under the bound"):
        so.run(alice, so.Request(state_id=STATE, candidate_id=old))
    # verified again, it is known again and can be recorded
    assert _store(alice, "# parent\n" + NVRTC, Verdict.faster) == parent
    assert ro.run(alice, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=parent)).recorded


def test_kb_stats_count_the_kept_verdicts_and_those_removed_under_the_bound(
        clients: tuple[ToolContext, ToolContext]) -> None:
    alice, bob = clients
    _flood(alice, "alice", KEEP + 3)
    _flood(bob, "bob", KEEP)
    cli = [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(alice.kb_path), "kb", "stats"]
    got = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    stats = json.loads(got.stdout)["stats"]
    assert stats["candidates"] == 2 * KEEP and stats["candidates_removed"] == 3
    table = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert "3 more removed under the per-client bound" in table.stdout
