"""Single operator (elementwise): swish / SiLU written as x * sigmoid(x) on a (8192, 8192) tensor.

Eager PyTorch runs two kernels and moves the tensor through memory three times; a fused kernel
reads it once and writes once.
"""

import torch
import torch.nn as nn

ROWS = 8192
COLS = 8192


class Model(nn.Module):
    """y = x * sigmoid(x)."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list:
    return []
