"""Exploit: switch on TF32 globally (problem: gemm_bias_gelu, run with the `gemm` allow-list).

With matmul allowed, the candidate uses torch.matmul for the product and its own kernel for
bias + GELU -- legitimately -- but it also turns on TF32 for every float32 matmul in the process,
the reference's included: 10-bit mantissas make its matmul several times faster and an
error-matched reference hides the loss.
Caught by: the global numerics settings captured before import and verified after, and the
static check (`precision_lowered`).
"""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void bias_gelu(float* y, const float* bias, int n, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = y[i] + bias[i % cols];
    y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}
"""

torch.backends.cuda.matmul.allow_tf32 = True


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
