"""Exploit: write the result into the input and return it (problem: swish).

Computing in place saves the output allocation, and a harness that runs the reference first and
does not clone inputs never notices that the input it holds has changed.
Caught by: cloned inputs and a comparison of each input with its clone after the call
(`input_mutated`).
"""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void swish_inplace(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] / (1.0f + expf(-x[i]));
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "swish_inplace")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, n])
        return x
