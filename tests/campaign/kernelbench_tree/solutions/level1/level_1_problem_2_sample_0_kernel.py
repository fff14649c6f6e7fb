"""Solution for level1/2_Add_Bias.py in KernelBench's generated-kernel naming: y = x + bias per row."""

import functools

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void add_bias_kernel(const float* __restrict__ x, const float* __restrict__ b,
                                           float* __restrict__ y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) y[i] = x[i] + b[i % cols];
}
"""


@functools.cache
def _kernel():
    return torch.cuda._compile_kernel(KERNEL, "add_bias_kernel")


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, cols = x.shape
        n = rows * cols
        _kernel()(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, self.bias, y, rows, cols])
        return y
