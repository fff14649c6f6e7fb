"""A model whose forward derives tensors from its buffers (a normalisation from running statistics, a
mask inverted): what a decomposition must not write into a part as zeros."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d=16, t=8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.register_buffer("running_mean", torch.arange(d, dtype=torch.float32) * 0.1)
        self.register_buffer("running_var", torch.linspace(0.5, 2.0, d))
        self.register_buffer("mask", torch.tril(torch.ones(t, t)).bool(), persistent=False)
        self.register_buffer("scale", torch.full((d,), 3.0), persistent=False)

    def forward(self, x):
        # x: (B, T, D)
        y = (x - self.running_mean) / torch.sqrt(self.running_var + 1e-5)
        y = self.fc(y) * self.scale
        att = y @ y.transpose(1, 2)
        att = att.masked_fill(~self.mask, float("-inf"))
        att = torch.softmax(att, dim=-1)
        return att @ y


def get_inputs():
    return [torch.randn(2, 8, 16)]


def get_init_inputs():
    return []
