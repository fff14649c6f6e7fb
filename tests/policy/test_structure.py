"""Reading a reference's operations from its source: the example problems land in the families
and states their code says, and optimizations for work they do not do are ruled out."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.policy.structure import COMPUTE_STATE, MEMORY_STATE, REQUIRES, OpFamily, reference_structure

PROBLEMS = Path(__file__).resolve().parents[2] / "examples" / "problems"


@pytest.mark.parametrize(
    ("problem", "families", "state"),
    [
        ("swish", {OpFamily.elementwise}, MEMORY_STATE),
        ("elementwise_chain_deep", {OpFamily.elementwise}, MEMORY_STATE),
        ("softmax", {OpFamily.softmax}, MEMORY_STATE),
        ("row_sum", {OpFamily.reduction}, MEMORY_STATE),
        ("layer_norm", {OpFamily.reduction}, MEMORY_STATE),
        ("gemm", {OpFamily.gemm}, COMPUTE_STATE),
        ("conv2d", {OpFamily.conv}, COMPUTE_STATE),
        ("attention_scores", {OpFamily.gemm, OpFamily.softmax, OpFamily.attention}, COMPUTE_STATE),
    ],
)
def test_example_problems(problem: str, families: set[OpFamily], state: str) -> None:
    structure = reference_structure((PROBLEMS / f"{problem}.py").read_text())
    assert families <= structure.families, structure
    assert structure.state_id == state


def test_an_elementwise_reference_rules_out_attention_and_gemm_work() -> None:
    ruled_out = reference_structure((PROBLEMS / "swish.py").read_text()).ruled_out()
    assert {"flash_attention_tiling", "online_softmax", "use_tensor_cores_mma",
            "implicit_gemm_convolution"} <= set(ruled_out)
    attention = reference_structure((PROBLEMS / "attention_scores.py").read_text()).ruled_out()
    assert "flash_attention_tiling" not in attention and "online_softmax" not in attention


def test_only_the_model_class_counts_and_bad_source_is_neutral() -> None:
    source = "import torch\nclass Helper:\n    def f(self, a, b):\n        return a @ b\n" \
             "class Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
    assert reference_structure(source).families == {OpFamily.elementwise}
    broken = reference_structure("def (:")
    assert broken.state_id == MEMORY_STATE and broken.ruled_out() == sorted(REQUIRES)


def test_every_ruled_out_optimization_exists_in_the_seed() -> None:
    import json

    seed = Path(__file__).resolve().parents[2] / "kb" / "seed" / "optimizations.json"
    ids = {o["id"] for o in json.loads(seed.read_text())}
    assert set(REQUIRES) <= ids
