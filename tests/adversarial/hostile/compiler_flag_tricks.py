"""Attack: compiler flags that run commands or read files during a build: nvcc's `-wrapper` runs
a shell (on code under `if False:` too: the compile-only path reads sources without running
them), `-include` puts a private file into the compile log, `-fplugin` loads code into the
compiler, `-Xcompiler` passes any of these on.

Stopped by: the flag allow-lists (`harness.builds.toolchain`): the build is refused, naming the flags,
before any compiler runs. Beneath them, the compilers run in the sandbox, where the shell would be
nobody's and the private file absent (tests/adversarial/hostile/test_hostile_cpu.py runs nvcc with
`-wrapper` directly in the sandbox to show that).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA = r"""
__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }
void launch(float* x) { k<<<1, 32>>>(x); }
"""

if False:  # never runs; compile-only reads it all the same
    load_inline(name="hostile_flags_dead", cpp_sources="void launch(float* x);", cuda_sources=CUDA,
                extra_cuda_cflags=["-wrapper", "/bin/sh,-c,touch __MARKER__"])

_ext = load_inline(
    name="hostile_flags", cpp_sources="void launch(float* x);", cuda_sources=CUDA,
    extra_cuda_cflags=["-wrapper", "/bin/sh,-c,touch __MARKER__", "-Xcompiler=-include__SSH_KEY__"],
    extra_cflags=["-include", "__SSH_KEY__", "-fplugin=/tmp/evil.so"],
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)
