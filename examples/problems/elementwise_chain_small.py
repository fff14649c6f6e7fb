"""Fused chain on a tiny tensor: 40 elementwise ops on two vectors of 8192 floats.

Each op is its own kernel in eager PyTorch, so the forward is bound by launch overhead (40
launches) rather than by its 96 KB of data; one fused kernel does it all in a single launch.
"""

import torch
import torch.nn as nn

N = 8192


class Model(nn.Module):
    """A chain of 40 elementwise ops over two inputs."""

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
        w = z * 2.0 - 1.0
        w = torch.atan(w)
        w = w + x * y
        w = torch.erf(w)
        w = w * torch.rsqrt(1.0 + y * y)
        w = torch.maximum(w, z - 0.5)
        w = torch.relu(w) + 0.01 * w
        w = w * 0.5 + z
        return w


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs() -> list:
    return []
