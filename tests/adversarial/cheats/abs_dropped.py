"""Exploit: a shortcut that is only right on non-negative inputs (problem: problems/abs_affine).

The problem's input comes from torch.rand (all >= 0), where |x| is x: this kernel computes 3x - 1
without the absolute value.
Caught by: the different-distribution sets, whose signs vary (`distribution_shortcut`)."""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void abs_dropped(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v * 3.0f - 1.0f;
    }
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "abs_dropped")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, out, n])
        return out
