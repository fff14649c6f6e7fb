"""Small model: a transformer-style MLP block, Linear(1024 -> 4096), GELU, Linear(4096 -> 1024), on 2048 rows."""

import torch
import torch.nn as nn

ROWS = 2048
HIDDEN = 1024
EXPANSION = 4


class Model(nn.Module):
    """y = fc2(gelu(fc1(x)))."""

    def __init__(self, hidden: int, expansion: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, hidden * expansion)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden * expansion, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, HIDDEN)]


def get_init_inputs() -> list:
    return [HIDDEN, EXPANSION]
