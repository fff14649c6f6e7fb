"""Linear layer, a sum over its outputs, then a scale (KernelBench level-2 format).

The sum over a linear layer's outputs has an exact rewrite: sum_j (x . W_j + b_j) = x . colsum(W) + sum(b),
the columns of W summed once per call instead of a (batch x in x out) GEMM. A candidate doing that is
legitimately far faster than the reference's roofline (its FLOPs at peak) suggests.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    """y = scale * linear(x).sum(dim=1, keepdim=True)."""

    def __init__(self, in_features: int, out_features: int, scale: float) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        x = torch.sum(x, dim=1, keepdim=True)
        return x * self.scale


BATCH = 1024
IN_FEATURES = 4096
OUT_FEATURES = 4096
SCALE = 0.5


def get_inputs() -> list[torch.Tensor]:
    return [torch.rand(BATCH, IN_FEATURES)]


def get_init_inputs() -> list:
    return [IN_FEATURES, OUT_FEATURES, SCALE]
