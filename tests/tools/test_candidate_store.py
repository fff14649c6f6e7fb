"""The sources and reports kept of verified candidates (tools.candidate_store): each client keeps at
most its newest few that nothing needs, and never loses one an outcome names, one another client
verified too, one a composition takes; another client's stay. Real KB files, the real tools (a real
compile-only check with nvcc), a real decomposition."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kb_mcp.harness.judgment.findings import Timings
from kb_mcp.harness.judgment.verdict import CompileResult, InputSetCheck, VerifyResult
from kb_mcp.harness.problem import Problem, candidate_id, load_problem, parse_problem
from kb_mcp.kb.errors import SettingError
from kb_mcp.kb.models import Verdict
from kb_mcp.server import kb_views
from kb_mcp.tools import candidate_store, compile_and_verify, decompose_problem
from kb_mcp.tools import record_outcome as ro
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
    for cid in ids:  # every verdict stays in the KB
        assert alice.store.get_candidate(cid) is not None


def test_a_source_an_outcome_names_survives_the_bound(clients: tuple[ToolContext, ToolContext]) -> None:
    alice, _ = clients
    parent = _store(alice, "# parent\n" + NVRTC)
    child = _store(alice, "# child\n" + NVRTC)
    ro.run(alice, ro.Request(state_id=STATE, optimization_id=OPT, candidate_id=child, parent_candidate_id=parent))
    flood = _flood(alice, "later")
    assert _kept(alice) == {parent, child, *flood[-KEEP:]}


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


def test_compose_still_finds_the_part_candidate_it_takes_after_the_bound(
        clients: tuple[ToolContext, ToolContext], tmp_path: Path) -> None:
    alice, _ = clients
    (tmp_path / "mlp.py").write_text(MODEL)
    req = decompose_problem.Request(problem=str(tmp_path / "mlp.py"), out_dir="parts", compose=True, verify=False)
    out = Path(decompose_problem.run(alice, req).out_dir)
    part_file = next(p for p in sorted((out / "parts").glob("part*.py")) if "relu" in p.read_text())
    part = parse_problem(part_file.read_text(), name=part_file.stem)
    own = part_file.read_text().replace("class Model(", "class ModelNew(").replace("torch.relu(", "torch.relu_(")
    best = _store(alice, own, Verdict.faster, part)
    flood = [_store(alice, f"# try {i}\n{own}", Verdict.needs_gpu, part) for i in range(KEEP + 2)]
    assert _kept(alice) == {best, *flood[-KEEP:]}
    picks = {p.part: p for p in decompose_problem.run(alice, req).picks}
    assert picks[part_file.stem].taken == "candidate" and picks[part_file.stem].candidate_id == best


def test_a_removed_sources_candidate_page_says_it_was_removed_and_why(
        clients: tuple[ToolContext, ToolContext]) -> None:
    alice, _ = clients
    first, *rest = _flood(alice, "page")
    assert first not in _kept(alice)
    gone = kb_views.candidate_detail(alice.store, alice.candidates_dir, first)
    assert gone is not None and gone.source is None and gone.record.candidate_id == first
    assert gone.source_removed and "no longer kept" in gone.source_removed
    assert candidate_store.ENV_CANDIDATES_KEPT_PER_CLIENT in gone.source_removed
    kept = kb_views.candidate_detail(alice.store, alice.candidates_dir, rest[-1])
    assert kept is not None and kept.source and kept.source_removed is None
