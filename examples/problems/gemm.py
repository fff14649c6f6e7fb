"""Single operator: dense matrix product C = A @ B in float32 (2048 x 2048 x 2048, ~17 GFLOP)."""

import torch
import torch.nn as nn

M = 2048
N = 2048
K = 2048


class Model(nn.Module):
    """C = A @ B."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs() -> list:
    return []
