"""What a reference model computes, read from its source: the state to start from when there is no
profile, and the optimizations its structure rules out.

A compile-only campaign (no GPU) has no profile to classify. Starting every problem in one fixed
state made the selection draw attention tiling for an elementwise swish; the reference's own
operations say more. This reads the problem's `Model` (its `__init__` and `forward`) with `ast`,
never running it, and names the families of operations it uses.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from enum import Enum

from kb_mcp.kb import pyparse


class OpFamily(str, Enum):
    """Kinds of work a reference does, as far as choosing a first optimization goes."""

    gemm = "gemm"  # matmul, linear, bmm, einsum
    conv = "conv"
    attention = "attention"  # scaled_dot_product_attention, or softmax together with a matmul
    softmax = "softmax"
    reduction = "reduction"  # sum, mean, norms, max
    scan = "scan"  # cumsum, cumprod
    transpose = "transpose"  # permute, transpose
    elementwise = "elementwise"


_CALLS: dict[OpFamily, frozenset[str]] = {
    OpFamily.gemm: frozenset({"matmul", "mm", "bmm", "linear", "einsum", "addmm", "baddbmm", "Linear", "Bilinear"}),
    OpFamily.conv: frozenset({"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                              "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"}),
    OpFamily.attention: frozenset({"scaled_dot_product_attention", "MultiheadAttention"}),
    OpFamily.softmax: frozenset({"softmax", "log_softmax", "Softmax", "LogSoftmax"}),
    OpFamily.reduction: frozenset({"sum", "mean", "amax", "amin", "max", "min", "norm", "var", "std", "prod",
                                   "logsumexp",
                                   "layer_norm", "group_norm", "batch_norm", "instance_norm", "rms_norm", "LayerNorm",
                                   "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm2d",
                                   "RMSNorm",
                                   "argmax", "argmin", "cross_entropy", "mse_loss", "nll_loss", "kl_div"}),
    OpFamily.scan: frozenset({"cumsum", "cumprod", "cummax", "cummin"}),
    OpFamily.transpose: frozenset({"transpose", "permute", "t"}),
}

# Optimizations that only make sense where the reference does this kind of work (seed ids).
REQUIRES: dict[str, frozenset[OpFamily]] = {
    "flash_attention_tiling": frozenset({OpFamily.attention}),
    "online_softmax": frozenset({OpFamily.softmax, OpFamily.attention}),
    "back_to_back_gemm_fusion": frozenset({OpFamily.gemm, OpFamily.attention}),
    "fuse_epilogue_into_gemm": frozenset({OpFamily.gemm, OpFamily.conv}),
    "use_tensor_cores_mma": frozenset({OpFamily.gemm, OpFamily.conv, OpFamily.attention}),
    "hopper_wgmma_pipeline": frozenset({OpFamily.gemm, OpFamily.conv, OpFamily.attention}),
    "register_tiling_microkernel": frozenset({OpFamily.gemm, OpFamily.conv, OpFamily.attention}),
    "implicit_gemm_convolution": frozenset({OpFamily.conv}),
    "single_pass_scan": frozenset({OpFamily.scan}),
    "fuse_reduction_with_producer": frozenset({OpFamily.reduction, OpFamily.softmax}),
    "warp_shuffle_reduction": frozenset({OpFamily.reduction, OpFamily.softmax, OpFamily.scan}),
    "transpose_via_shared_tile": frozenset({OpFamily.transpose}),
}

COMPUTE_STATE = "compute_throughput_saturated"  # GEMM, convolution, attention: math-heavy
MEMORY_STATE = "memory_bandwidth_saturated"  # elementwise and reductions stream memory


@dataclass(frozen=True)
class Structure:
    """What the reference's `Model` does, and where that points without a profile."""

    families: frozenset[OpFamily]
    calls: tuple[str, ...] = field(default=())

    @property
    def state_id(self) -> str:
        """The state a first kernel of such a reference most likely sits in."""
        heavy = {OpFamily.gemm, OpFamily.conv, OpFamily.attention}
        return COMPUTE_STATE if self.families & heavy else MEMORY_STATE

    def ruled_out(self, optimization_ids: list[str] | None = None) -> list[str]:
        """Optimizations whose required kind of work the reference does not do."""
        ids = optimization_ids if optimization_ids is not None else list(REQUIRES)
        return sorted(i for i in ids if i in REQUIRES and not (REQUIRES[i] & self.families))

    def describe(self) -> str:
        """One line for the campaign's diagnosis."""
        kinds = ", ".join(sorted(f.value for f in self.families)) or "no recognised operation"
        return f"the reference's Model does {kinds}"


def reference_structure(source: str) -> Structure:
    """The operation families of the `Model` class in a KernelBench problem's source."""
    try:
        tree = pyparse.parse(source)
    except SyntaxError:
        return Structure(frozenset())
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    calls = _called_names(model if model is not None else tree)
    families = {family for family, names in _CALLS.items() if names & set(calls)}
    if OpFamily.softmax in families and OpFamily.gemm in families:
        families.add(OpFamily.attention)
    if not families or calls:
        families.add(OpFamily.elementwise)  # activations and arithmetic are in nearly every forward
    return Structure(frozenset(families), tuple(sorted(set(calls))))


def _called_names(node: ast.AST) -> list[str]:
    names: list[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute):
                names.append(func.attr)
            elif isinstance(func, ast.Name):
                names.append(func.id)
        elif isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.MatMult):
            names.append("matmul")
    return names
