"""Fused chain: softmax(Q K^T / sqrt(d)) V for batch 8, 8 heads, sequence 1024, head size 64.

Written with explicit matmuls and a softmax, so eager PyTorch materialises the 1024 x 1024 score
matrix of every head (256 MB) between kernels.
"""

import math

import torch
import torch.nn as nn

BATCH = 8
HEADS = 8
SEQ = 1024
HEAD_DIM = 64


class Model(nn.Module):
    """Scaled dot-product attention without masking or dropout."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        return torch.matmul(torch.softmax(scores, dim=-1), v)


def get_inputs() -> list[torch.Tensor]:
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs() -> list:
    return []
