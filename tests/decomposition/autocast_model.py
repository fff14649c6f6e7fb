"""A model that runs part of its forward under autocast: a dtype rule no traced graph keeps."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x):
        with torch.no_grad():
            stats = x.mean(dim=0, keepdim=True)
        x = x - stats
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            h = self.fc1(x)
        h = torch.relu(h.float())
        return self.fc2(h)


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return []
