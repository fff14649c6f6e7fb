"""Solution for level2/9_Matmul_Subtract_Multiply_ReLU.py: cuBLAS for the GEMM, the elementwise tail
fused into one kernel (track fp32, allow-list `gemm`).

The Linear layer stays on cuBLAS (F.linear, bias included: FP32 with TF32 off in this track); the
subtraction, the multiplication and the ReLU run as one NVRTC kernel over the GEMM's output, in
place (16-byte loads and stores), instead of three passes over it. Needs `allow=["gemm"]` when
verified: such a verdict is a loosened one (kept and shown, never credited to a KB score).
"""

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

KERNEL = r"""
extern "C" __global__ void sub_mul_relu(float* __restrict__ y, int n, double sub, double mul) {
    const float s = (float)sub, m = (float)mul;
    long long n4 = n / 4, stride = (long long)gridDim.x * blockDim.x;
    float4* y4 = reinterpret_cast<float4*>(y);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = y4[i];
        v.x = fmaxf((v.x - s) * m, 0.0f);
        v.y = fmaxf((v.y - s) * m, 0.0f);
        v.z = fmaxf((v.z - s) * m, 0.0f);
        v.w = fmaxf((v.w - s) * m, 0.0f);
        y4[i] = v;
    }
    long long tail = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (tail < n) y[tail] = fmaxf((y[tail] - s) * m, 0.0f);
}
"""

THREADS = 256
MAX_BLOCKS = 132 * 16


@functools.cache
def _kernel():
    return torch.cuda._compile_kernel(KERNEL, "sub_mul_relu")


class ModelNew(nn.Module):
    """relu((linear(x) - subtract_value) * multiply_value)."""

    def __init__(self, in_features: int, out_features: int, subtract_value: float, multiply_value: float) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.subtract_value = float(subtract_value)
        self.multiply_value = float(multiply_value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.linear.weight, self.linear.bias)  # cuBLAS: a fresh, contiguous tensor of ours
        n = y.numel()
        blocks = max(1, min(MAX_BLOCKS, (n // 4 + THREADS - 1) // THREADS))
        _kernel()(grid=(blocks, 1, 1), block=(THREADS, 1, 1), args=[y, n, self.subtract_value, self.multiply_value])
        return y
