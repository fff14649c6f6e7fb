"""Solution for level2/1_Scale_Add_ReLU.py whose kernel does not compile (a missing semicolon)."""

import functools

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void fused_kernel(const float* __restrict__ x, const float* __restrict__ b,
                                        float* __restrict__ y, float factor, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x
    if (i < rows * cols) y[i] = fmaxf(x[i] * factor + b[i % cols], 0.0f);
}
"""


@functools.cache
def _kernel():
    return torch.cuda._compile_kernel(KERNEL, "fused_kernel")


class ModelNew(nn.Module):
    def __init__(self, dim: int, factor: float):
        super().__init__()
        self.factor = factor
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, cols = x.shape
        n = rows * cols
        _kernel()(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1),
                  args=[x, self.bias, y, float(self.factor), rows, cols])
        return y
