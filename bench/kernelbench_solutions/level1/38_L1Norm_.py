"""Solution for level1/38_L1Norm_.py: x / mean(|x|) along dim 1 in one kernel, one block per row (track fp32).

Each of the 32768 blocks reduces its row of 65535 floats (the mean of |x|) with a per-thread loop, warp
shuffles and one shared-memory step, then writes the row divided by the result. Rows are read twice
(the reduction, then the division), as eager's two kernels do, and written once; offsets are 64-bit
(the tensor has 2^31 - 32768 elements).
"""

import functools

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void row_norm_kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    __shared__ float partial[32];
    __shared__ float scale;
    long long base = (long long)blockIdx.x * cols;
    float acc = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = x[base + j];
        acc += fabsf(v);
    }
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffff, acc, off);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        float s = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffff, s, off);
        if (threadIdx.x == 0) scale = s / (float)cols;
    }
    __syncthreads();
    const float d = scale;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) y[base + j] = x[base + j] / d;
}
"""

THREADS = 512


@functools.cache
def _kernel():
    return torch.cuda._compile_kernel(KERNEL, "row_norm_kernel")


class ModelNew(nn.Module):
    """x / mean(|x|, dim=1, keepdim=True) for a 2-D x."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, cols = x.shape[0], x.numel() // x.shape[0]
        _kernel()(grid=(rows, 1, 1), block=(THREADS, 1, 1), args=[x, y, rows, cols])
        return y
