"""Candidates for the Linear parts of level-3 models (bench/tc_fp32_sync.py's part candidates, written
by bench/l3_linear_parts.py), on real decompositions of real KernelBench models: each candidate's
ModelNew holds exactly its part's state-dict keys and shapes, made in the part's order, and builds
without a GPU; parts the core cannot serve are refused with the reason; one candidate's CUDA source
compiles for sm_90a without spills (nvcc)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from l3_linear_parts import PartRow, part_rows, parts_table  # noqa: E402
from tc_fp32_parts import PartRefused, linear_part, part_candidate  # noqa: E402

from kb_mcp.decomposition.decompose import DecompositionError, decompose_many, write  # noqa: E402

# A KernelBench checkout beside the repository, or $KB_MCP_KERNELBENCH (as tests/decomposition/test_recompose.py)
LEVEL3 = Path(os.environ.get("KB_MCP_KERNELBENCH", Path(__file__).resolve().parents[3] / "shared" / "kernelbench")) \
    / "level3"

pytestmark = pytest.mark.skipif(not LEVEL3.is_dir(), reason=f"KernelBench level 3 not at {LEVEL3}")

# fx parts with ReLU and none (1_MLP), with Tanh beside a part holding a buffer (33); export parts with
# tanh after a concatenation (34), with erf GELU and a no-op dropout on 3-D inputs beside convolutions
# and residual adds (29)
MODELS = ("1_MLP", "33_VanillaRNN", "34_VanillaRNNHidden", "29_SwinMLP")
# (model, part): its Linear's name, epilogue and bias, as the generator must read them
EXPECTED = {("1_MLP", "part01"): ("network.0", "relu", True), ("1_MLP", "part03"): ("network.4", "", True),
            ("33_VanillaRNN", "part02"): ("i2h", "tanh", True), ("33_VanillaRNN", "part03"): ("h2o", "", True),
            ("34_VanillaRNNHidden", "part03"): ("i2h", "tanh", True),
            ("29_SwinMLP", "part04"): ("layers.0.blocks.0.mlp.fc1", "gelu", True),
            ("29_SwinMLP", "part11"): ("layers.0.downsample.reduction", "", False)}  # built with bias=False


@pytest.fixture(scope="module")
def decomposed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[PartRow]]]:
    """The models decomposed at their real sizes (as `kb-mcp decompose` writes them), and the script's rows
    with the candidates it wrote."""
    root = tmp_path_factory.mktemp("l3")
    results = decompose_many([(m, (LEVEL3 / f"{m}.py").read_text()) for m in MODELS], jobs=2)
    out = {}
    for model, result in zip(MODELS, results):
        assert not isinstance(result, (DecompositionError, Exception)), result
        write(result[1], root / model)
        rows, others = part_rows(root / model)
        print(parts_table(model, rows, others))
        out[model] = (root / model, rows)
    return out


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"m_{abs(hash(str(path)))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _layout(module: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(k, tuple(v.shape)) for k, v in module.state_dict().items()]


def test_each_candidate_holds_its_parts_state_dict(decomposed: dict[str, tuple[Path, list[PartRow]]]) -> None:
    served = {m: [r for r in rows if r.candidate] for m, (_, rows) in decomposed.items()}
    assert {m: len(rows) for m, rows in served.items()} == {
        "1_MLP": 3, "33_VanillaRNN": 2, "34_VanillaRNNHidden": 1, "29_SwinMLP": 16}
    for rows in served.values():
        for row in rows:
            assert row.candidate is not None
            # on the meta device: the layout (names, shapes, order) without allocating 1 GB Linears
            with torch.device("meta"):
                part, candidate = _module(row.part_file).Model(), _module(row.candidate).ModelNew()
            assert _layout(candidate) == _layout(part), (row.problem, row.part)


def test_the_generator_reads_each_parts_linear_and_epilogue(
        decomposed: dict[str, tuple[Path, list[PartRow]]]) -> None:
    for (model, part), expected in EXPECTED.items():
        read = linear_part((decomposed[model][0] / "parts" / f"{part}.py").read_text(), model, part)
        assert (read.name, read.activation, read.bias) == expected, (model, part)


@pytest.mark.parametrize("model, part", [("29_SwinMLP", "part04"), ("29_SwinMLP", "part11"),
                                         ("34_VanillaRNNHidden", "part03")])
def test_a_candidate_builds_on_cpu_with_the_parts_values(decomposed: dict[str, tuple[Path, list[PartRow]]],
                                                          model: str, part: str) -> None:
    # export parts make the bias before the weight: the candidate must draw them in that order
    folder = decomposed[model][0]
    torch.manual_seed(7)
    reference = _module(folder / "parts" / f"{part}.py").Model().state_dict()
    torch.manual_seed(7)
    mine = _module(folder / "candidates" / f"{part}.py").ModelNew().state_dict()
    assert list(mine) == list(reference)
    assert all(torch.equal(mine[k], reference[k]) for k in reference)


def test_parts_the_core_cannot_serve_are_refused_with_the_reason(
        decomposed: dict[str, tuple[Path, list[PartRow]]]) -> None:
    why = {(r.problem, r.part): r.why_not for _, rows in decomposed.values() for r in rows if not r.candidate}
    assert why[("34_VanillaRNNHidden", "part01")] == "its forward takes 2 inputs; the kernel takes one"
    assert why[("29_SwinMLP", "part05")] == "its forward takes 2 inputs; the kernel takes one"  # fc2 + residual
    swin = decomposed["29_SwinMLP"][0] / "parts"
    with pytest.raises(PartRefused, match="the parameters of patch_embed.norm, patch_embed.proj, not of one "
                       r"Linear \(its forward calls conv2d, "):
        part_candidate(swin / "part01.py")
    rnn = decomposed["33_VanillaRNN"][0] / "parts"
    with pytest.raises(PartRefused, match="it holds hidden"):  # the hidden state, a buffer
        part_candidate(rnn / "part01.py")
    odd = (rnn / "part03.py").read_text().replace("in_features=16384", "in_features=16386")
    with pytest.raises(PartRefused, match="16386 input features: .* K must be a multiple of 4"):
        linear_part(odd, "33_VanillaRNN", "part03")
    proc = subprocess.run([sys.executable, str(BENCH / "tc_fp32_sync.py"), "--part", str(swin / "part01.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no candidate for" in proc.stderr and "conv2d" in proc.stderr


@pytest.mark.nvcc
def test_a_part_candidate_compiles_for_sm90a_without_spills(decomposed: dict[str, tuple[Path, list[PartRow]]],
                                                            tmp_path: Path) -> None:
    from tc_fp32_check import nvcc_report

    cuda = _module(decomposed["33_VanillaRNN"][0] / "candidates" / "part02.py").CUDA
    row = nvcc_report(cuda, tmp_path)
    assert row["ok"] and row["spill_bytes"] == 0 and row["registers"] == 168, row
