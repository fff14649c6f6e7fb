"""Fused chain: 3x3 convolution (32 -> 64 channels), GroupNorm (8 groups), ReLU; batch 16 at 64x64."""

import torch
import torch.nn as nn

BATCH = 16
IN_CHANNELS = 32
OUT_CHANNELS = 64
GROUPS = 8
SIZE = 64


class Model(nn.Module):
    """y = relu(group_norm(conv3x3(x)))."""

    def __init__(self, in_channels: int, out_channels: int, groups: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm = nn.GroupNorm(groups, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x)))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(BATCH, IN_CHANNELS, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [IN_CHANNELS, OUT_CHANNELS, GROUPS]
