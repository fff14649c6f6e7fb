"""A deep fused chain on a tiny tensor: the 40-op elementwise chain applied three times (120 ops).

Eager PyTorch launches one kernel per op, so the forward costs 120 launches' worth of host time
for 96 KB of data; a fused kernel does all three passes in a single launch. The gap between the
two is launch overhead, and it is wide enough (well over 10x on an H100) that host-side timing
noise cannot hide or fake it.
"""

import torch
import torch.nn as nn

N = 8192
PASSES = 3


def chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One pass: the same 40 elementwise ops as elementwise_chain_small."""
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


class Model(nn.Module):
    """Three passes of the chain, each feeding the next (y stays the second operand)."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for _ in range(PASSES):
            x = chain(x, y)
        return x


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs() -> list:
    return []
