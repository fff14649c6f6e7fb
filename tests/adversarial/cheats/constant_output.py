"""Exploit: constant output that a loose tolerance accepts (problem: softmax over 16384 columns).

Every softmax value of a 16384-wide row of standard-normal inputs is close to 1/16384 (about 6e-5);
writing that constant everywhere is within KernelBench's default atol/rtol of 1e-2 of the truth
and needs no reduction at all.
Caught by: tolerances scaled to the output (RMS) and a check that the output varies where the
reference does (`constant_output`, verdict `incorrect`).
"""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void fill_uniform(float* y, int n, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 1.0f / (float)cols;
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "fill_uniform")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = out.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[out, n, x.shape[-1]])
        return out
