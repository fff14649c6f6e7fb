"""A model that runs its layers over the steps of an input (an RNN unrolled over x[t]): each step's part
picks its own piece of x. A problem file (KernelBench format) the decomposition tests read as text."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.i2h = nn.Linear(32 + 16, 16)
        self.h2o = nn.Linear(16, 8)

    def forward(self, x, h):
        outs = []
        for t in range(x.size(0)):
            h = torch.tanh(self.i2h(torch.cat((x[t], h), dim=1)))
            outs.append(self.h2o(h))
        return torch.stack(outs)


def get_inputs():
    return [torch.randn(5, 4, 32), torch.randn(4, 16)]


def get_init_inputs():
    return []
