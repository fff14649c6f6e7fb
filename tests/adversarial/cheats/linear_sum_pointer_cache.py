"""Exploit: the exact rewrite of linear_sum, with its output cached on the input's address and shape.

The first call on an address computes x . colsum(W) + sum(b) honestly; every later call on the same
address returns that first output. A timing loop that reuses one input, or an allocator that hands
fresh inputs the same address, sees a forward that costs nothing: a speedup far above any
threshold, which the escalation must not turn into an accepted result.
Caught by: new values in the same input buffers (`result_caching`), fresh inputs re-checked in every
timed run (`timed_output_mismatch`), a repeat of an earlier set (`stateful_forward`).
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
    def __init__(self, in_features: int, out_features: int, scale: float) -> None:
        super().__init__()
        lin = nn.Linear(in_features, out_features)
        self.w = lin.weight
        self.b = lin.bias
        self.scale = float(scale)
        self.cache: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (x.data_ptr(), tuple(x.shape))
        if key in self.cache:
            return self.cache[key]
        rows, cols = self.w.shape
        chunks = min(CHUNKS, rows)
        part = torch.empty(chunks, cols, device=x.device, dtype=torch.float32)
        c = torch.empty(cols + 1, device=x.device, dtype=torch.float32)
        out = torch.empty(x.shape[0], 1, device=x.device, dtype=torch.float32)
        col_blocks = (cols + THREADS - 1) // THREADS
        _kernel("colsum_partial")(grid=(col_blocks, chunks, 1), block=(THREADS, 1, 1),
                                  args=[self.w, part, rows, cols, (rows + chunks - 1) // chunks])
        _kernel("colsum_finish")(grid=(col_blocks + 1, 1, 1), block=(THREADS, 1, 1),
                                 args=[part, self.b, c, cols, chunks, rows])
        _kernel("row_dot")(grid=(x.shape[0], 1, 1), block=(THREADS, 1, 1),
                           args=[x.contiguous(), c, out, cols, self.scale])
        self.cache[key] = out
        return out
