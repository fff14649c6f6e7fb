"""On a GPU: a level-3 model (1_MLP) decomposed, one part given a kernel of its own (its ReLUs launch an
NVRTC kernel, its GEMM stays PyTorch's), the model composed from that part and the reference's
other parts, and the composed candidate verified end to end in composed mode: a standard verdict
(faster or slower) with its coverage, computed with the model's own weights."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kb_mcp.decomposition.assemble import write_composed
from kb_mcp.kb.models import Strength, Verdict
from kb_mcp.tools import compile_and_verify, decompose_problem
from kb_mcp.tools.context import ToolContext

LEVEL3 = Path(os.environ.get("KB_MCP_KERNELBENCH", Path(__file__).resolve().parents[3] / "shared" / "kernelbench")) \
    / "level3"

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (LEVEL3 / "1_MLP.py").is_file(), reason=f"no {LEVEL3}")]

OWN_RELU = '''

RELU_SOURCE = r"""
extern "C" __global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
"""
relu_kernel = torch.cuda._compile_kernel(RELU_SOURCE, "relu_kernel")


class OwnReLU(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        relu_kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, y, n])
        return y


class ModelNew(PartReference):
    """The part with its ReLUs in a kernel of its own (its GEMMs stay the reference's ops)."""

    def __init__(self):
        super().__init__()
        for module in list(self.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, nn.ReLU):
                    setattr(module, name, OwnReLU())
'''


def own_part(reference: str) -> str:
    """A part candidate of our own from a part file that runs torch.nn ReLU modules."""
    head, _, _ = reference.partition("\ndef get_inputs")
    return head.replace("class Model(nn.Module)", "class PartReference(nn.Module)") + OWN_RELU


def test_a_model_composed_with_one_own_part_is_verified_in_composed_mode(tmp_path: Path) -> None:
    ctx = ToolContext(tmp_path / "kb.json", client_name="test")
    try:
        got = decompose_problem.run(ctx, decompose_problem.Request(problem=str(LEVEL3 / "1_MLP.py"),
                                                                   out_dir="parts", top=50))
        out = Path(got.out_dir)
        part = next(p for p in got.parts if "ReLU" in p.label)
        candidate = tmp_path / "own_part.py"
        candidate.write_text(own_part(Path(part.file).read_text()))
        with ctx.store.read() as view:
            composition = write_composed(out, view, ctx.candidates_dir, {part.name: candidate})
        assert composition.own_parts == 1
        result = compile_and_verify.run(ctx, compile_and_verify.Request(
            problem=str(LEVEL3 / "1_MLP.py"), candidate=composition.file, mode="composed"))
        rec = result.record
        assert rec.verdict in (Verdict.faster, Verdict.slower), result.summary
        assert rec.mode == "composed" and rec.strength == Strength.standard
        assert rec.coverage is not None and 0.0 < rec.coverage < 1.0
    finally:
        ctx.close()
