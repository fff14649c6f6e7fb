import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Scales, adds a bias, and applies ReLU.
    """
    def __init__(self, dim: int, factor: float):
        super().__init__()
        self.factor = factor
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.factor + self.bias)


batch_size = 32
dim = 2048
factor = 0.5


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, factor]
