"""Exploit: make synchronize a no-op and keep the GPU busy after "return" (problem: swish).

With `torch.cuda.synchronize` (and Event.synchronize) replaced by no-ops, a harness that times
with the host clock around `forward(); synchronize()` measures only the launch. The kernel still
runs and the result is right whenever it is finally read.
Caught by: trusted synchronize/timer functions captured before import and verified after
(`harness_tampering`), and the static check.
"""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void swish(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / (1.0f + expf(-x[i]));
}
"""

torch.cuda.synchronize = lambda device=None: None
torch.cuda.Event.synchronize = lambda self: None


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "swish")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, out, n])
        return out
