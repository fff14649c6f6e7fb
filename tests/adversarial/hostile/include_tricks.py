"""Attack: `#include` a private file by absolute path (its content then appears in the compiler's
error messages, which come back in the verdict), by climbing out with `..`, through a macro (a
computed include), with the assembler's `.incbin`, or by `#pragma GCC dependency` (the compiler
opens the file to compare its date: whether it exists, and how old it is, shows in the log).

Stopped by: the include check (`harness.builds.allow_lists.include_refusals`): only plain relative names
of the toolchain's headers are compiled; the others are refused with a message, before any
compiler runs. Beneath it, the mount view: the file does not exist where the compiler runs (NVRTC
on a GPU reads includes in-process, in the sandboxed worker).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ABSOLUTE = r"""
#include "__SSH_KEY__"
extern "C" __global__ void a(float* x) {}
"""
CLIMB = r"""
#include "../../../../..__SSH_KEY__"
extern "C" __global__ void b(float* x) {}
"""
COMPUTED = r"""
#define SECRET "__SSH_KEY__"
#include SECRET
__global__ void c(float* x) {}
void run_c(float* x) {}
"""
INCBIN = r"""
__asm__(".section .rodata\n.incbin \"__SSH_KEY__\"\n.previous");
void run_d(float* x) {}
"""
DEPENDENCY = r"""
#pragma GCC dependency "__SSH_KEY__"
void run_e(float* x) {}
"""

_a = torch.cuda._compile_kernel(ABSOLUTE, "a")
_b = torch.cuda._compile_kernel(CLIMB, "b")
_c = load_inline(name="hostile_include", cpp_sources="void run_c(float* x);", cuda_sources=COMPUTED)
_d = load_inline(name="hostile_incbin", cpp_sources=INCBIN)
_e = load_inline(name="hostile_dependency", cpp_sources=DEPENDENCY)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)
