"""Single operator (reduction): sum over the last dimension of an (8192, 16384) tensor, kept as a column."""

import torch
import torch.nn as nn

ROWS = 8192
COLS = 16384


class Model(nn.Module):
    """y = x.sum(dim=-1, keepdim=True)."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=-1, keepdim=True)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list:
    return []
