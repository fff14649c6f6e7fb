"""Fused chain: Linear (2048 -> 4096, with bias) followed by GELU, on 2048 rows (~34 GFLOP)."""

import torch
import torch.nn as nn

BATCH = 2048
IN_FEATURES = 2048
OUT_FEATURES = 4096


class Model(nn.Module):
    """y = gelu(x @ W^T + b) (exact, erf-based GELU)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.linear(x))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs() -> list:
    return [IN_FEATURES, OUT_FEATURES]
