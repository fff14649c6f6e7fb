"""Honest candidate for gemm_bias_gelu under the `gemm` allow-list.

The matrix product stays with torch.matmul (cuBLAS, which the allow-list permits for GEMM
problems); bias and exact GELU are fused into one kernel of our own instead of two PyTorch ops.
TF32 stays off, so the float32 product is bit-for-bit the reference's.
"""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void bias_gelu(float* __restrict__ y, const float* __restrict__ bias, int n, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = y[i] + bias[i % cols];
    y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}
"""


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.kernel = torch.cuda._compile_kernel(KERNEL, "bias_gelu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, self.linear.weight.t())
        n = y.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[y, self.linear.bias, n, y.shape[-1]])
        return y
