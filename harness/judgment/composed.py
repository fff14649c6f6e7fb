"""Composed mode (docs/harness.md, "Composed mode"): what a candidate for a model may keep of PyTorch.

In composed mode a candidate may run the PyTorch compute ops that the reference itself runs, as long
as at least one kernel of its own runs; any other op stays a `library_call`. The reference's own op
set is recorded twice, each at the level one of the runtime guards judges the candidate at, so both
sides are compared in the same spelling:

* `dispatch`: the ATen ops the op recorder (`harness.worker.ops.OpRecorder`, a dispatch mode) sees
  one forward of the reference run, before any candidate code runs in the verify worker (e.g.
  `aten::native_layer_norm`, `aten::addmm`, `aten::convolution`);
* `kernels`: the PyTorch ops that launched GPU kernels in one forward of the reference under the
  profiler, in a census worker no candidate has run in (`harness.judgment.kernels.kernel_ops`: e.g.
  `aten::cudnn_convolution`, which the dispatch mode never sees below `aten::convolution`).

Both are cached per (problem hash, GPU, torch version, track) beside the baselines
(`harness.baselines.ReferenceOpsCache`): the workers read the cache (read-only in their sandbox) and
send what they recorded back; the pool stores it.
"""

from __future__ import annotations

from collections.abc import Iterable

from kb_mcp.harness.judgment.kernels import op_packet
from kb_mcp.kb.models import Mode

__all__ = ["COMPOSED", "coverage_note", "kept_packets"]

COMPOSED: Mode = "composed"


def kept_packets(ops: Iterable[str] | None) -> frozenset[str]:
    """The overload-packet names of recorded ops (`aten::addmm` -> `addmm`), as an allowance."""
    return frozenset(op_packet(op) for op in ops or ())


def coverage_note(coverage: float | None) -> str:
    """How a composed verdict's summary states its coverage."""
    if coverage is None:
        return "composed mode (coverage not measured)"
    return f"composed mode: {coverage:.0%} of its GPU time in its own kernels"
