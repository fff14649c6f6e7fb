"""Candidate for examples/problems/linear_sum.py: the exact rewrite, NVRTC style.

sum_j (x . W_j + b_j) = x . colsum(W) + sum(b): W's columns are summed on every call (the weights may
change between calls, so nothing derived from them is kept), then each row of x is dotted with the
column sums. Three kernels: partial column sums over chunks of W's rows (coalesced: neighbouring
threads read neighbouring columns), the chunks and the bias summed (in double), and one block per
row of x for the dot product (a Python float reaches NVRTC kernels as a double). It reads W and x
once: about 1/out_features of the GEMM's arithmetic (at the problem's sizes ~0.06 ms of reads on an
H100; the call's host time, three launches and three allocations, is most of what it measures).
The parameters keep nn.Linear's values under other names (`w`, `b`).
"""

import functools

import torch
import torch.nn as nn

KERNELS = r"""
extern "C" __global__ void colsum_partial(const float* __restrict__ w, float* __restrict__ part,
                                          int rows, int cols, int rows_per_chunk) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    int begin = blockIdx.y * rows_per_chunk;
    int end = min(rows, begin + rows_per_chunk);
    float acc = 0.0f;
    for (int r = begin; r < end; ++r) acc += w[(size_t)r * cols + col];
    part[(size_t)blockIdx.y * cols + col] = acc;
}

extern "C" __global__ void colsum_finish(const float* __restrict__ part, const float* __restrict__ bias,
                                         float* __restrict__ c, int cols, int chunks, int rows) {
    __shared__ double partial[256];
    int col_blocks = (cols + blockDim.x - 1) / blockDim.x;
    if (blockIdx.x < col_blocks) {
        int col = blockIdx.x * blockDim.x + threadIdx.x;
        if (col < cols) {
            double acc = 0.0;
            for (int k = 0; k < chunks; ++k) acc += (double)part[(size_t)k * cols + col];
            c[col] = (float)acc;
        }
        return;
    }
    // The last block: sum(bias) into c[cols].
    double acc = 0.0;
    for (int j = threadIdx.x; j < rows; j += blockDim.x) acc += (double)bias[j];
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) c[cols] = (float)partial[0];
}

extern "C" __global__ void row_dot(const float* __restrict__ x, const float* __restrict__ c,
                                   float* __restrict__ out, int cols, double scale) {
    __shared__ double partial[256];
    const float* row = x + (size_t)blockIdx.x * cols;
    double acc = 0.0;
    for (int k = threadIdx.x; k < cols; k += blockDim.x) acc += (double)row[k] * (double)c[k];
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = (float)((partial[0] + (double)c[cols]) * scale);
}
"""

THREADS = 256
CHUNKS = 64


@functools.cache
def _kernel(name: str):
    return torch.cuda._compile_kernel(KERNELS, name)


class ModelNew(nn.Module):
    """scale * (x . colsum(W) + sum(b)), which equals scale * linear(x).sum(dim=1, keepdim=True)."""

    def __init__(self, in_features: int, out_features: int, scale: float) -> None:
        super().__init__()
        lin = nn.Linear(in_features, out_features)  # the reference's initialisation, same seed, same values
        self.w = lin.weight
        self.b = lin.bias
        self.scale = float(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w, b = self.w.contiguous(), self.b.contiguous()
        rows, cols = w.shape  # out_features, in_features
        batch = x.shape[0]
        if x.dim() != 2 or x.shape[1] != cols:
            raise ValueError(f"expected x of shape (batch, {cols}), got {tuple(x.shape)}")
        chunks = min(CHUNKS, rows)
        per_chunk = (rows + chunks - 1) // chunks
        part = torch.empty(chunks, cols, device=x.device, dtype=torch.float32)
        c = torch.empty(cols + 1, device=x.device, dtype=torch.float32)
        out = torch.empty(batch, 1, device=x.device, dtype=torch.float32)
        col_blocks = (cols + THREADS - 1) // THREADS
        stream = torch.cuda.current_stream()  # looked up once: each launch would otherwise look it up again
        _kernel("colsum_partial")(grid=(col_blocks, chunks, 1), block=(THREADS, 1, 1),
                                  args=[w, part, rows, cols, per_chunk], stream=stream)
        _kernel("colsum_finish")(grid=(col_blocks + 1, 1, 1), block=(THREADS, 1, 1),
                                 args=[part, b, c, cols, chunks, rows], stream=stream)
        _kernel("row_dot")(grid=(batch, 1, 1), block=(THREADS, 1, 1), args=[x, c, out, cols, self.scale],
                           stream=stream)
        return out
