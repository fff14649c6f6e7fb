"""A small KernelBench-format problem for the profiling tests: relu(x) * y + 1 over 2^22 floats.

Eager PyTorch runs three elementwise kernels (relu, mul, add) where one fused kernel would do.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * y + 1.0


N = 1 << 22


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
