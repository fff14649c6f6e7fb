"""Small model: two conv-ReLU-maxpool stages and a linear classifier on 64 RGB images of 64x64."""

import torch
import torch.nn as nn

BATCH = 64
SIZE = 64
CLASSES = 10


class Model(nn.Module):
    """conv(3->32) relu pool, conv(32->64) relu pool, flatten, linear(64*16*16 -> classes)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(64 * (SIZE // 4) * (SIZE // 4), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(BATCH, 3, SIZE, SIZE)]


def get_init_inputs() -> list:
    return [CLASSES]
