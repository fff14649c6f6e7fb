"""Second shapes of a KernelBench-format problem (`harness.shapes`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kb_mcp.harness.shapes import size_constants, variants

PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features, dim):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.dim = dim

    def forward(self, x):
        return self.linear(x).sum(dim=self.dim, keepdim=True)

batch_size = 128   # sizes
in_features = 1024
out_features: int = 512
dim = 1            # a dimension, not a size
kernel_size = 3
verbose = True
unused_size = 4096 # read by neither get_inputs nor get_init_inputs
twice = 64
twice = 128

def get_inputs():
    return [torch.rand(batch_size, in_features + twice - twice)]

def get_init_inputs():
    return [in_features, out_features, dim]
'''


def _run(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<variant>", "exec"), namespace)
    return namespace


def test_sizes_are_the_large_integer_constants_the_input_functions_read() -> None:
    assert size_constants(PROBLEM) == {"batch_size": 128, "in_features": 1024, "out_features": 512}
    assert size_constants("def get_inputs(:\n") == {}
    assert size_constants("N = 64\ndef forward():\n    return N\n") == {}


def test_variants_halve_every_size_then_each_alone_and_run() -> None:
    plans = variants(PROBLEM)
    assert [p.changes for p in plans] == [
        (("batch_size", 128, 64), ("in_features", 1024, 512), ("out_features", 512, 256)),
        (("batch_size", 128, 64),),
        (("in_features", 1024, 512),),
        (("out_features", 512, 256),),
    ]
    assert plans[0].describe() == "batch_size=64 (was 128), in_features=512 (was 1024), out_features=256 (was 512)"
    ns = _run(plans[0].source)
    assert ns["get_init_inputs"]() == [512, 256, 1]
    assert tuple(ns["get_inputs"]()[0].shape) == (64, 512)
    assert (ns["dim"], ns["kernel_size"], ns["unused_size"]) == (1, 3, 4096)
    only_batch = _run(plans[1].source)
    assert only_batch["get_init_inputs"]() == [1024, 512, 1] and only_batch["batch_size"] == 64


def test_a_problem_without_sizes_has_no_second_shape() -> None:
    assert variants("import torch\ndef get_inputs():\n    return [torch.rand(4, 4)]\n") == []


def test_the_linear_sum_example_halves_its_sizes_and_its_reference_runs_there() -> None:
    # The second shape the evidence of its exact rewrite uses (tests/harness/test_evidence_gpu.py).
    source = (Path(__file__).resolve().parents[2] / "examples" / "problems" / "linear_sum.py").read_text()
    assert size_constants(source) == {"BATCH": 8192, "IN_FEATURES": 4096, "OUT_FEATURES": 4096}
    plan = variants(source)[0]
    assert plan.describe() == "BATCH=4096 (was 8192), IN_FEATURES=2048 (was 4096), OUT_FEATURES=2048 (was 4096)"
    ns = _run(plan.source)
    init = ns["get_init_inputs"]()
    assert init == [2048, 2048, 0.5]  # the scale is no size: unchanged
    (x,) = ns["get_inputs"]()
    assert tuple(x.shape) == (4096, 2048)
    model = ns["Model"](*init)
    with torch.no_grad():
        out = model(x[:4])
    assert tuple(out.shape) == (4, 1) and torch.isfinite(out).all()
