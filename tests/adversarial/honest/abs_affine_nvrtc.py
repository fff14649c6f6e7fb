"""Honest candidate for problems/abs_affine: |x| * 3 - 1 in one kernel, right for inputs of either
sign."""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void abs_affine(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = fabsf(v) * 3.0f - 1.0f;
    }
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "abs_affine")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, out, n])
        return out
