"""Candidate for examples/problems/softmax.py, NVRTC style.

One block per row. A first pass keeps a running maximum and a running sum rescaled to it (online
softmax), so the row is read twice in all rather than three times; the second read mostly hits L2.
"""

import functools

import torch
import torch.nn as nn

KERNEL = r"""
#define THREADS 1024
#define NEG_INF __int_as_float(0xff800000)  // NVRTC has no math.h, hence no INFINITY

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    // Combine two (max, sum of exp(v - max)) pairs.
    if (m2 > m) { s = s * expf(m - m2) + s2; m = m2; }
    else if (m2 != NEG_INF) { s = s + s2 * expf(m2 - m); }
}

extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float sm[THREADS / 32];
    __shared__ float ss[THREADS / 32];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    float m = NEG_INF, s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) {
        float v = row[c];
        if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }
        else { s += expf(v - m); }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffff, m, offset);
        float s2 = __shfl_xor_sync(0xffffffff, s, offset);
        merge(m, s, m2, s2);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    if (warp == 0) {
        m = lane < THREADS / 32 ? sm[lane] : NEG_INF;
        s = lane < THREADS / 32 ? ss[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffff, m, offset);
            float s2 = __shfl_xor_sync(0xffffffff, s, offset);
            merge(m, s, m2, s2);
        }
        if (lane == 0) { sm[0] = m; ss[0] = s; }
    }
    __syncthreads();
    float row_max = sm[0];
    float inv = 1.0f / ss[0];
    for (int c = threadIdx.x; c < cols; c += THREADS) {
        out[c] = expf(row[c] - row_max) * inv;
    }
}
"""


@functools.cache
def _kernel():
    return torch.cuda._compile_kernel(KERNEL, "softmax_rows")


class ModelNew(nn.Module):
    """softmax over the last dimension, one block per row."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        cols = x.shape[-1]
        rows = x.numel() // cols
        _kernel()(grid=(rows, 1, 1), block=(1024, 1, 1), args=[x, y, cols])
        return y
