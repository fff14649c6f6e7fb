"""Single operator: 3x3 convolution, 64 -> 128 channels, padding 1, batch 16 at 64x64 (~9.7 GFLOP)."""

import torch
import torch.nn as nn

BATCH = 16
IN_CHANNELS = 64
OUT_CHANNELS = 128
SIZE = 64
KERNEL = 3


class Model(nn.Module):
    """y = Conv2d(in, out, 3, padding=1)(x)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(BATCH, IN_CHANNELS, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL]
