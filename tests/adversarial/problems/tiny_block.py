"""A small transformer block (pre-norm attention with its softmax spelled out, then a GELU MLP): the
model the composed-mode cases of the adversarial suite run against."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, TOKENS, DIM, HEADS = 8, 128, 256, 4


class Model(nn.Module):
    """x + attention(LayerNorm(x)), then + MLP(LayerNorm(.)) with GELU."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads)), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(BATCH, TOKENS, DIM)]


def get_init_inputs() -> list:
    return [DIM, HEADS]
