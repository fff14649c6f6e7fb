"""Candidate for examples/problems/swish.py, NVRTC style.

Eager PyTorch computes sigmoid(x) into a temporary and multiplies in a second kernel. Fused, the
tensor is read once and written once, with 16-byte vector loads and a grid-stride loop sized to
the GPU.
"""

import functools

import torch
import torch.nn as nn

KERNEL = r"""
__device__ __forceinline__ float swish(float v) { return v / (1.0f + expf(-v)); }

extern "C" __global__ void swish_kernel(const float* __restrict__ x, float* __restrict__ y,
                                        int n, int vectorized) {
    int stride = gridDim.x * blockDim.x;
    int start = blockIdx.x * blockDim.x + threadIdx.x;
    int done = 0;
    if (vectorized) {
        int n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        float4* y4 = reinterpret_cast<float4*>(y);
        for (int i = start; i < n4; i += stride) {
            float4 v = x4[i];
            v.x = swish(v.x);
            v.y = swish(v.y);
            v.z = swish(v.z);
            v.w = swish(v.w);
            y4[i] = v;
        }
        done = n4 * 4;
    }
    for (int i = done + start; i < n; i += stride) {
        y[i] = swish(x[i]);
    }
}
"""


@functools.cache
def _kernel():
    return torch.cuda._compile_kernel(KERNEL, "swish_kernel")


@functools.cache
def _blocks(device_index: int) -> int:
    # Enough resident blocks to fill every SM several times over; the loop covers the rest.
    return torch.cuda.get_device_properties(device_index).multi_processor_count * 8


class ModelNew(nn.Module):
    """y = x * sigmoid(x) in one pass."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        vectorized = int(x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0)
        _kernel()(grid=(_blocks(x.device.index or 0), 1, 1), block=(256, 1, 1), args=[x, y, n, vectorized])
        return y
