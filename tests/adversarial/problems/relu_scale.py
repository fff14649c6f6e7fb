"""Non-negative inputs: y = relu(x) * 2 on a (4096, 4096) tensor drawn with torch.rand, as most
KernelBench problems draw theirs. On such inputs the ReLU changes nothing."""

import torch
import torch.nn as nn

ROWS = 4096
COLS = 4096


class Model(nn.Module):
    """y = relu(x) * 2."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2.0


def get_inputs() -> list[torch.Tensor]:
    return [torch.rand(ROWS, COLS)]


def get_init_inputs() -> list:
    return []
