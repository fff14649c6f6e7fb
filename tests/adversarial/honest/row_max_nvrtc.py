"""Honest candidate for problems/row_max: one block per row, the maximum started at -inf."""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void row_max(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float best[256];
    const float* row = x + (long long)blockIdx.x * cols;
    float m = __int_as_float(0xff800000);  // -inf: NVRTC has no math.h, so no INFINITY
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
    best[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) best[threadIdx.x] = fmaxf(best[threadIdx.x], best[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) y[blockIdx.x] = best[0];
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "row_max")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, cols = x.shape
        out = torch.empty(rows, dtype=x.dtype, device=x.device)
        self.kernel(grid=(rows, 1, 1), block=(256, 1, 1), args=[x, out, cols])
        return out
