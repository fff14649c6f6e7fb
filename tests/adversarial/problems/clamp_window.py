"""Non-negative inputs: y = clamp(x, -0.5, 0.75) on a (4096, 4096) tensor drawn with torch.rand. On
such inputs the lower bound is never reached."""

import torch
import torch.nn as nn

ROWS = 4096
COLS = 4096
LOW = -0.5
HIGH = 0.75


class Model(nn.Module):
    """y = clamp(x, LOW, HIGH)."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=LOW, max=HIGH)


def get_inputs() -> list[torch.Tensor]:
    return [torch.rand(ROWS, COLS)]


def get_init_inputs() -> list:
    return []
