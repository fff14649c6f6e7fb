"""Hostile candidates the server tests send: what the sandbox records of them is what those tests check."""

# A load_inline candidate whose nvcc flags ask the compiler to run a shell (`-wrapper`): refused, and
# recorded as an attempt by whoever sent it.
HOSTILE_FLAGS = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA = "__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\\nvoid launch(float* x) { k<<<1, 32>>>(x); }\\n"
_ext = load_inline(name="tricky", cpp_sources="void launch(float* x);", cuda_sources=CUDA,
                   extra_cuda_cflags=["-wrapper", "/bin/sh,-c,id"])


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)
'''
