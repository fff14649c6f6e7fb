"""Candidate for relu_mul_add.py: one fused kernel compiled through NVRTC (the fast path)."""

import torch
import torch.nn as nn

SOURCE = r"""
extern "C" __global__ void fused_relu_mul_add(const float* x, const float* y, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = x[i];
    out[i] = (v > 0.0f ? v : 0.0f) * y[i] + 1.0f;
  }
}
"""
_kernel = None


def _fused():
    global _kernel
    if _kernel is None:  # compiled on the first forward, which the profiler's warm-up absorbs
        _kernel = torch.cuda._compile_kernel(SOURCE, "fused_relu_mul_add")
    return _kernel


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        _fused()(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, y, out, n])
        return out
