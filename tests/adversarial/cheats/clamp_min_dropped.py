"""Exploit: a shortcut that is only right on non-negative inputs (problem: problems/clamp_window).

clamp(x, -0.5, 0.75) on inputs from torch.rand never reaches its lower bound: this kernel keeps
the upper one only.
Caught by: the different-distribution sets, whose signs vary and magnitudes stretch
(`distribution_shortcut`)."""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void clamp_min_dropped(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = fminf(v, 0.75f);
    }
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "clamp_min_dropped")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, out, n])
        return out
