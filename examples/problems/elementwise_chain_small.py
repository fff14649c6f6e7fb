"""Fused chain on a tiny tensor: 20 elementwise ops on 8192 floats.

Each op is its own kernel in eager PyTorch, so the forward is bound by launch overhead (about
20 launches) rather than by the 32 KB of data; one fused kernel does it in a single launch.
"""

import torch
import torch.nn as nn

N = 8192


class Model(nn.Module):
    """A chain of 20 elementwise ops over two inputs."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = x * 1.5 + 0.25
        z = torch.tanh(z)
        z = z * y
        z = z - 0.1
        z = torch.sigmoid(z)
        z = z * z
        z = z + torch.abs(y)
        z = torch.sqrt(z + 1.0)
        z = torch.log1p(z)
        z = torch.clamp(z, 0.0, 2.0)
        z = torch.sin(z * 3.0)
        z = z * torch.cos(x)
        z = torch.exp(-z * z)
        z = z / (1.0 + torch.abs(x))
        return z


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs() -> list:
    return []
