"""decompose_problem: a model decomposed in the sandbox into part files, composed back from the KB's
verdicts on its parts (a part's best standard candidate, the reference part elsewhere), and the
composed candidate, given the model's weights by name as the verify worker does in composed mode,
computes the model's function. Real files, the real sandbox, a real KB; no GPU."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from pydantic import ValidationError

from kb_mcp.harness.problem import candidate_id, parse_problem
from kb_mcp.harness.worker.loading import share_reference_state
from kb_mcp.kb.models import CandidateRecord, Verdict
from kb_mcp.tools import decompose_problem
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext

MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.norm = nn.LayerNorm(h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x)))) + x


def get_inputs():
    return [torch.randn(4, 32)]


def get_init_inputs():
    return [32, 64]
'''


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _own_part(part_file: Path) -> str:
    """A part candidate of our own: the reference part renamed, its ReLU written differently (clamp)."""
    text = part_file.read_text().replace("class Model(", "class ModelNew(")
    return re.sub(r"torch\.relu\((\w+)\)", r"torch.clamp_min(\1, 0.0)", text)


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[ToolContext]:
    c = ToolContext(tmp_path / "kb.json", client_name="test")
    yield c
    c.close()


def test_a_model_is_decomposed_into_ranked_part_files(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "mlp.py").write_text(MODEL)
    got = decompose_problem.run(ctx, decompose_problem.Request(problem=str(tmp_path / "mlp.py"), out_dir="parts"))
    assert Path(got.out_dir) == ctx.artifacts_dir.resolve() / "decompositions" / "parts"
    assert got.method == "fx" and got.parts_total >= 2 and got.share_basis == "estimated"
    assert abs(sum(p.share for p in got.parts) - 1.0) < 1e-3 and got.parts[0].share >= got.parts[-1].share
    assert {p.kind for p in got.parts} >= {"gemm"}
    for part in got.parts:
        parse_problem(Path(part.file).read_text())  # each part is a KernelBench problem
    assert got.composed_file is None and "compose=true" in got.next_step
    assert got.layers == []  # every layer of the MLP is one file


def test_a_layer_over_an_inputs_steps_is_reported_once_with_all_its_places(ctx: ToolContext, tmp_path: Path) -> None:
    steps = Path(__file__).parents[1] / "decomposition" / "steps_model.py"
    got = decompose_problem.run(ctx, decompose_problem.Request(problem=str(steps), out_dir="parts"))
    h2o = [layer for layer in got.layers if layer.files_total == 5]
    assert len(h2o) == 1 and h2o[0].places == 5 and h2o[0].kind == "gemm"
    assert len(h2o[0].files) == 5 and all(Path(f).is_file() for f in h2o[0].files)
    assert 0 < h2o[0].share <= 1 and got.files_total < got.parts_total


def test_compose_takes_a_parts_verified_candidate_and_computes_the_models_function(
        ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "mlp.py").write_text(MODEL)
    req = decompose_problem.Request(problem=str(tmp_path / "mlp.py"), out_dir="parts", compose=True, verify=False)
    first = decompose_problem.run(ctx, req)
    out = Path(first.out_dir)
    assert first.picks and all(p.taken == "reference" for p in first.picks)
    # a verified, faster candidate for the part holding the ReLU, stored as compile_and_verify stores one
    holder = next(p for p in first.picks if "relu" in (out / f"parts/{p.part}.py").read_text())
    part_file = out / "parts" / f"{holder.part}.py"
    own = _own_part(part_file)
    assert "clamp_min" in own
    part_problem = parse_problem(part_file.read_text(), name=holder.part)
    cid = candidate_id(part_problem, own)
    ctx.candidates_dir.mkdir(parents=True, exist_ok=True)
    (ctx.candidates_dir / f"{cid}.py").write_text(own)
    with ctx.store.transaction() as tx:
        tx.put_candidate(CandidateRecord(candidate_id=cid, problem=holder.part, problem_hash=part_problem.hash,
                                         verdict=Verdict.faster, arch="sm_90", device="H200", time_ms=1.0,
                                         eager_ms=2.0, speedup_vs_baseline=2.0))
    second = decompose_problem.run(ctx, req)
    taken = {p.part: p for p in second.picks}
    assert taken[holder.part].taken == "candidate" and taken[holder.part].candidate_id == cid
    assert sum(p.taken == "candidate" for p in second.picks) == 1
    text = Path(second.composed_file or "").read_text()
    assert "clamp_min" in text and f"candidate {cid}" in text and "class ModelNew" in text
    # the harness builds both after the same seed, then (composed mode) gives ModelNew the model's weights
    model_mod, composed_mod = _load(tmp_path / "mlp.py", "t_mlp"), _load(Path(second.composed_file or ""), "t_comp")
    torch.manual_seed(3)
    ref = model_mod.Model(32, 64).eval()
    torch.manual_seed(3)
    cand = composed_mod.ModelNew(32, 64).eval()
    copied = share_reference_state(ref, cand)
    assert set(copied) == set(ref.state_dict())
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert torch.equal(ref(x), cand(x))


def test_a_model_that_does_not_build_is_the_callers_to_fix(ctx: ToolContext, tmp_path: Path) -> None:
    broken = MODEL.replace("return [32, 64]", "return [32, 64, 5]")
    with pytest.raises(ToolError, match="could not be decomposed"):
        decompose_problem.run(ctx, decompose_problem.Request(problem=broken, out_dir="p"))


def test_a_model_that_never_builds_is_stopped_at_the_requests_timeout(ctx: ToolContext, tmp_path: Path) -> None:
    endless = (Path(__file__).parents[1] / "decomposition" / "endless_model.py").read_text()
    heard: list[str] = []
    with pytest.raises(ToolError) as caught:
        decompose_problem.run(ctx, decompose_problem.Request(problem=endless, out_dir="p", timeout_s=3),
                              lambda done, total=None, message=None: heard.append(message or ""))
    said = str(caught.value)
    assert caught.value.whose == "caller" and "ran past the time limit of 3 s" in said, said
    assert "`timeout_s` in a decompose_problem request" in said
    assert "tracing problem in the sandbox (time limit 3 s)..." in heard, heard  # the client's progress
    assert not (ctx.artifacts_dir / "decompositions" / "p").exists()


def test_a_requests_timeout_is_taken_within_its_range_and_refused_outside_it() -> None:
    assert decompose_problem.Request(problem=MODEL).timeout_s == 180
    assert [decompose_problem.Request(problem=MODEL, timeout_s=s).timeout_s for s in (1, 3600)] == [1, 3600]
    for seconds in (0, 0.5, 3601, float("inf"), float("nan")):
        with pytest.raises(ValidationError) as caught:
            decompose_problem.Request(problem=MODEL, timeout_s=seconds)
        (error,) = caught.value.errors()
        assert error["loc"] == ("timeout_s",) and error["type"] in ("greater_than_equal", "less_than_equal"), error


def _escapes(ctx: ToolContext, tmp_path: Path) -> list[str]:
    """out_dir values that name a folder outside the KB's folder for decompositions."""
    root = ctx.artifacts_dir / "decompositions"
    root.mkdir(parents=True)
    (root / "link").symlink_to(tmp_path / "victim", target_is_directory=True)
    return [str(tmp_path / "victim"), "../../victim", str(root / ".." / ".." / "victim"), "link", "~", str(root), "."]


def test_an_out_dir_outside_the_kbs_decompositions_folder_is_the_callers_error_and_nothing_is_written(
        ctx: ToolContext, tmp_path: Path) -> None:
    victim = tmp_path / "victim"  # e.g. the operator's own KernelBench workspace
    victim.mkdir()
    (victim / "problem.py").write_text("# the operator's own problem\n")
    for out_dir in _escapes(ctx, tmp_path):
        with pytest.raises(ToolError, match="outside the KB's folder for decompositions") as err:
            decompose_problem.run(ctx, decompose_problem.Request(problem=MODEL, out_dir=out_dir, compose=True))
        assert err.value.whose == "caller" and str((ctx.artifacts_dir / "decompositions").resolve()) in str(err.value)
    assert sorted(p.name for p in victim.iterdir()) == ["problem.py"]
    assert (victim / "problem.py").read_text() == "# the operator's own problem\n"


def test_a_folder_holding_files_a_decomposition_does_not_write_is_not_written_over(ctx: ToolContext) -> None:
    mine = ctx.artifacts_dir / "decompositions" / "mine"
    (mine / "parts").mkdir(parents=True)
    (mine / "parts" / "notes.txt").write_text("kept")
    with pytest.raises(ToolError, match=r"does not write \(parts/notes.txt\)") as err:
        decompose_problem.run(ctx, decompose_problem.Request(problem=MODEL, out_dir="mine"))
    assert err.value.whose == "caller"
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == ["parts", "parts/notes.txt"]


def test_another_problems_decomposition_and_a_linked_file_in_it_are_not_written_over(
        ctx: ToolContext, tmp_path: Path) -> None:
    first = decompose_problem.run(ctx, decompose_problem.Request(problem=MODEL, out_dir="shared"))
    out = Path(first.out_dir)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    other = MODEL.replace("torch.relu", "torch.sigmoid")
    with pytest.raises(ToolError, match="decomposition of another problem"):
        decompose_problem.run(ctx, decompose_problem.Request(problem=other, out_dir="shared"))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    outside = tmp_path / "outside.py"
    outside.write_text("# not the decomposition's\n")
    (out / "composed.py").symlink_to(outside)  # compose would write through it
    with pytest.raises(ToolError, match=r"does not write \(composed.py\)"):
        decompose_problem.run(ctx, decompose_problem.Request(problem=MODEL, out_dir="shared", compose=True,
                                                             verify=False))
    assert outside.read_text() == "# not the decomposition's\n"


def test_an_operators_folder_holding_another_problems_decomposition_is_refused_not_overwritten(
    ctx: ToolContext, tmp_path: Path
) -> None:
    mine, out = tmp_path / "mine.py", tmp_path / "parts"
    mine.write_text(MODEL)
    decompose_problem.run_in(ctx, decompose_problem.Request(problem=str(mine)), out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    other = tmp_path / "other.py"
    other.write_text(MODEL.replace("return [32, 64]", "return [32, 128]"))
    for compose in (False, True):
        with pytest.raises(ToolError, match=r"holds the decomposition of another problem, 'mine' .* not of 'other'"):
            decompose_problem.run_in(ctx, decompose_problem.Request(problem=str(other), compose=compose,
                                                                    verify=False), out)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # the same problem, changed: its own decomposition is made again in its folder
    mine.write_text(MODEL.replace("return [32, 64]", "return [32, 96]"))
    again = decompose_problem.run_in(ctx, decompose_problem.Request(problem=str(mine)), out)
    assert again.problem == "mine" and (out / "problem.py").read_text() == mine.read_text()


def test_an_operators_folder_whose_manifest_is_not_a_decomposition_is_refused(ctx: ToolContext, tmp_path: Path) -> None:
    out = tmp_path / "parts"
    out.mkdir()
    (out / "decomposition.json").write_text('{"not": "a decomposition"}')
    with pytest.raises(ToolError, match="is not a decomposition this kb-mcp can read"):
        decompose_problem.run_in(ctx, decompose_problem.Request(problem=MODEL), out)
    assert (out / "decomposition.json").read_text() == '{"not": "a decomposition"}'
