"""Solution for level1/88_MinGPTNewGelu.py: the tanh-form GELU in one pass (track fp32).

Eager PyTorch runs the formula as about eight kernels (pow, two multiplies, add, tanh, add, two
more multiplies), each reading and writing the whole 8192 x 8192 tensor. One NVRTC kernel computes
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in registers: 16-byte loads and stores, a
grid-stride loop, and tanhf (not a fast-math approximation) so the result stays within the strict
FP32 tolerance.
"""

import functools

import torch
import torch.nn as nn

KERNEL = r"""
__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    float inner = k * (x + 0.044715f * (x * x * x));
    return 0.5f * x * (1.0f + tanhf(inner));
}

extern "C" __global__ void gelu_tanh_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    long long n4 = n / 4;
    long long stride = (long long)gridDim.x * blockDim.x;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x4[i];
        y4[i] = make_float4(gelu_tanh(v.x), gelu_tanh(v.y), gelu_tanh(v.z), gelu_tanh(v.w));
    }
    // The tail (n not a multiple of 4), by the first threads.
    long long tail = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (tail < n) y[tail] = gelu_tanh(x[tail]);
}
"""

THREADS = 256
MAX_BLOCKS = 132 * 16  # a few waves of an H100; the loop strides over the rest


@functools.cache
def _kernel():
    return torch.cuda._compile_kernel(KERNEL, "gelu_tanh_kernel")


class ModelNew(nn.Module):
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        blocks = max(1, min(MAX_BLOCKS, (n // 4 + THREADS - 1) // THREADS))
        _kernel()(grid=(blocks, 1, 1), block=(THREADS, 1, 1), args=[x, y, n])
        return y
