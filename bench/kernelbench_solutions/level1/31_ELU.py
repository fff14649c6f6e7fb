"""Solution for level1/31_ELU.py: ELU in one pass over a 6 GiB tensor (track fp32).

x if x > 0, else alpha * (exp(x) - 1), with expm1f (accurate near 0) and 16-byte loads and stores in
a grid-stride loop with 64-bit indices (4096 x 393216 elements). alpha reaches the kernel as a double,
as NVRTC passes a Python float.
"""

import functools

import torch
import torch.nn as nn

KERNEL = r"""
__device__ __forceinline__ float elu(float x, float alpha) {
    return x > 0.0f ? x : alpha * expm1f(x);
}

extern "C" __global__ void elu_kernel(const float* __restrict__ x, float* __restrict__ y, int n, double alpha_d) {
    const float alpha = (float)alpha_d;
    long long n4 = n / 4;
    long long stride = (long long)gridDim.x * blockDim.x;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x4[i];
        y4[i] = make_float4(elu(v.x, alpha), elu(v.y, alpha), elu(v.z, alpha), elu(v.w, alpha));
    }
    long long tail = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (tail < n) y[tail] = elu(x[tail], alpha);
}
"""

THREADS = 256
MAX_BLOCKS = 132 * 16


@functools.cache
def _kernel():
    return torch.cuda._compile_kernel(KERNEL, "elu_kernel")


class ModelNew(nn.Module):
    """ELU(x) with the given alpha."""

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        blocks = max(1, min(MAX_BLOCKS, (n // 4 + THREADS - 1) // THREADS))
        _kernel()(grid=(blocks, 1, 1), block=(THREADS, 1, 1), args=[x, y, n, self.alpha])
        return y
