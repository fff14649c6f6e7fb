"""Exploit: a shortcut that is only right on non-negative inputs (problem: problems/relu_scale).

The problem draws its input with torch.rand, so every value is >= 0 and the ReLU never changes
one: this kernel leaves it out and computes 2x. Every set drawn from the problem's own
distribution passes.
Caught by: the different-distribution sets, whose signs vary (`distribution_shortcut`, naming
the set: signs mixed per element, or every input negated)."""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void relu_dropped(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v * 2.0f;
    }
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "relu_dropped")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, out, n])
        return out
