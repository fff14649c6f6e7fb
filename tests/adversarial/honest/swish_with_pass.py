"""Honest candidate for swish that contains what naive checkers misread.

It has a `pass`, an except clause that re-raises, and comments and a docstring that mention
torch.matmul, cuBLAS and try/except. KernelBench's regex checker rejected an honest kernel over a
harmless `pass`; this one must pass the harness.
"""

import torch
import torch.nn as nn

KERNEL = r"""
// No cublasSgemm, no at::matmul here: just one fused elementwise pass.
extern "C" __global__ void swish(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / (1.0f + expf(-x[i]));
}
"""


class ModelNew(nn.Module):
    """Unlike the reference (sigmoid then a multiply, or torch.matmul elsewhere), one kernel."""

    def __init__(self) -> None:
        super().__init__()
        try:
            self.kernel = torch.cuda._compile_kernel(KERNEL, "swish")
        except RuntimeError as exc:  # say which kernel failed, then fail
            raise RuntimeError(f"swish kernel did not compile: {exc}") from exc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():
            x = x.contiguous()
        else:
            pass  # already contiguous: nothing to do
        out = torch.empty_like(x)
        n = x.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, out, n])
        return out
