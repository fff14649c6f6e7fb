"""Fused chain: y = LayerNorm(x + Linear(x)), hidden 1024, 4096 rows (~8.6 GFLOP)."""

import torch
import torch.nn as nn

ROWS = 4096
HIDDEN = 1024


class Model(nn.Module):
    """A residual projection followed by LayerNorm, as in a transformer sub-block."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.proj(x))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, HIDDEN)]


def get_init_inputs() -> list:
    return [HIDDEN]
