"""Single operator: softmax over the last dimension of a (4096, 16384) float32 tensor (memory-bound)."""

import torch
import torch.nn as nn

ROWS = 4096
COLS = 16384


class Model(nn.Module):
    """y = softmax(x, dim=-1)."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list:
    return []
