"""Single operator: LayerNorm over the last dimension (hidden 4096) of 16384 rows, with affine weights."""

import torch
import torch.nn as nn

ROWS = 16384
HIDDEN = 4096


class Model(nn.Module):
    """y = LayerNorm(hidden)(x), elementwise affine, eps 1e-5."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, HIDDEN)]


def get_init_inputs() -> list:
    return [HIDDEN]
