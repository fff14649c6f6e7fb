"""The example problem set: every file loads as a KernelBench problem, runs on CPU at reduced
sizes, and produces at full size the shapes its docstring promises (checked on the meta device,
so no memory is allocated)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kb_mcp.harness.problem import load_problem, parse_problem

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = sorted((ROOT / "examples" / "problems").glob("*.py"))
KINDS = {
    "single operator": {"gemm", "softmax", "layer_norm", "row_sum", "swish", "conv2d"},
    "fused chain": {"gemm_bias_gelu", "conv_groupnorm_relu", "elementwise_chain_small", "elementwise_chain_deep",
                    "linear_residual_layernorm",
                    "attention_scores"},
    "small model": {"mlp", "small_cnn"},
}


def _namespace(path: Path, shrink: int = 1) -> dict[str, Any]:
    """Executes the problem file; with `shrink`, divides its large size constants (>= 256) by it."""
    ns: dict[str, Any] = {"__name__": f"problem_{path.stem}"}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    if shrink > 1:
        for key, value in list(ns.items()):
            if key.isupper() and isinstance(value, int) and value >= 256:
                ns[key] = value // shrink
    return ns


def test_the_set_covers_the_promised_kinds() -> None:
    names = {p.stem for p in PROBLEMS}
    assert len(names) >= 12
    for kind, members in KINDS.items():
        assert members <= names, f"missing {kind} problems: {members - names}"


@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: p.stem)
def test_loads_as_kernelbench_problem(path: Path) -> None:
    problem = load_problem(path)
    assert problem.name == path.stem and problem.path == str(path.resolve())
    assert len(problem.hash) == 16
    assert parse_problem(path.read_text(), name=path.stem).hash == problem.hash
    doc = _namespace(path)["__doc__"]
    assert doc and len(doc.strip()) > 30, "each problem says what it computes"


@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: p.stem)
def test_full_size_shapes_on_meta(path: Path) -> None:
    ns = _namespace(path)
    with torch.device("meta"):
        model = ns["Model"](*ns["get_init_inputs"]())
        inputs = ns["get_inputs"]()
        out = model(*inputs)
    assert inputs and all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in inputs)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.numel() > 0
    # Sizes meant for 0.1-10 ms on an H100: at least a few thousand elements of work per input.
    assert sum(t.numel() for t in inputs) >= 8192


@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: p.stem)
def test_runs_on_cpu_at_reduced_size(path: Path) -> None:
    ns = _namespace(path, shrink=64)
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]())
    inputs = ns["get_inputs"]()
    assert all(t.device.type == "cpu" for t in inputs), "inputs are created on CPU (KernelBench convention)"
    with torch.no_grad():
        out = model(*inputs)
        again = model(*[t.clone() for t in inputs])
    assert torch.isfinite(out).all()
    assert torch.equal(out, again), "the reference is deterministic for equal inputs"
    # The output depends on the inputs (no problem is constant in its input).
    with torch.no_grad():
        other = model(*[t + 1.0 for t in inputs])
    assert not torch.equal(out, other)
