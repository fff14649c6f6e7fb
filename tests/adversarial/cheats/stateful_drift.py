"""Exploit: carry state across calls (problem: swish).

The kernel adds a per-call offset that grows with the number of calls (standing in for a running
statistic, a reused accumulator or a buffer not cleared between calls). The first call -- the one a
naive harness checks -- is exact; each later call drifts further.
Caught by: running each input set twice and comparing the runs, and re-checking outputs of timed
runs (`stateful_forward`, `timed_output_mismatch`).
"""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void swish_offset(const float* x, float* y, int n, int calls) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / (1.0f + expf(-x[i])) + 0.01f * (float)calls;
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "swish_offset")
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, out, n, self.calls])
        self.calls += 1
        return out
