"""A model whose construction never returns (it waits for something that does not come). A problem file
(KernelBench format) the decomposition tests give a short time limit."""

import time

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        while True:
            time.sleep(0.5)

    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(2, 4)]


def get_init_inputs():
    return []
