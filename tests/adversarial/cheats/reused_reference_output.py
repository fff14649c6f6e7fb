"""Exploit: return memory the reference just freed (problem: softmax).

A harness that runs the reference, copies its output aside and frees it, then runs the candidate,
hands the candidate's `torch.empty_like` the very block the reference wrote: the caching allocator
reuses freed blocks of the same size first. The "kernel" here returns at once, so the output is
whatever that memory held -- the reference's answer in such a harness.
Caught by: reference outputs kept alive and fresh output memory poisoned before each candidate
run (`uninitialized_output` / `reused_reference_output`).
"""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void touch_nothing(float* y, int n) {
    if (n < 0) y[0] = 0.0f;  // never true: leaves y as allocated
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "touch_nothing")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        self.kernel(grid=(1, 1, 1), block=(1, 1, 1), args=[out, out.numel()])
        return out
