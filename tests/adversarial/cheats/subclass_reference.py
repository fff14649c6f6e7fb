"""Exploit: inherit the reference (problem: softmax).

A copy of the reference `Model` is in the file and `ModelNew` subclasses it, adding a token kernel
in its constructor; forward is the reference's own.
Caught by: the static check (ModelNew subclasses Model) and the runtime class check
(`reference_fallback`), and the op recorder (`library_call`).
"""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void token(float* y) { if (threadIdx.x == 0) y[0] = y[0]; }
"""


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


class ModelNew(Model):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "token")
