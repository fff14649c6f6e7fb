"""Solution for level2/14_Gemm_Divide_Sum_Scaling.py: the exact algebraic rewrite (track fp32).

The reference computes y = x . W^T (batch x hidden), halves it, sums each row and scales:
out_b = s/2 * sum_j sum_k x_bk W_jk = s/2 * (x_b . c) with c_k = sum_j W_jk, the column sums of W.
So the 1024 x 8192 x 8192 GEMM becomes one read of W (the column sums, recomputed on every call:
the weight may change between calls) and one read of x (a dot product per row): about 1/hidden of
the arithmetic. Three NVRTC kernels: partial column sums over chunks of W's rows (neighbouring
threads read neighbouring columns, four at a time), the chunks added in double, and one block per
row of x for the dot product (double accumulation, warp shuffles).
"""

import functools

import torch
import torch.nn as nn

KERNELS = r"""
extern "C" __global__ void colsum_chunks(const float* __restrict__ w, float* __restrict__ part, int rows, int cols,
                                         int rows_per_chunk) {
    int col4 = blockIdx.x * blockDim.x + threadIdx.x;  // four columns per thread
    if (col4 * 4 >= cols) return;
    int begin = blockIdx.y * rows_per_chunk, end = min(rows, begin + rows_per_chunk);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int r = begin; r < end; ++r) {
        float4 v = reinterpret_cast<const float4*>(w + (size_t)r * cols)[col4];
        acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    }
    reinterpret_cast<float4*>(part + (size_t)blockIdx.y * cols)[col4] = acc;
}

extern "C" __global__ void colsum_finish(const float* __restrict__ part, double* __restrict__ c, int cols,
                                         int chunks) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    double acc = 0.0;
    for (int k = 0; k < chunks; ++k) acc += (double)part[(size_t)k * cols + col];
    c[col] = acc;
}

extern "C" __global__ void row_dot_scaled(const float* __restrict__ x, const double* __restrict__ c,
                                          float* __restrict__ out, int cols, double factor) {
    const float* row = x + (size_t)blockIdx.x * cols;
    double acc = 0.0;
    for (int k = threadIdx.x; k < cols; k += blockDim.x) acc += (double)row[k] * c[k];
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, off);
    __shared__ double partial[32];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0;
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, off);
        if (lane == 0) out[blockIdx.x] = (float)(acc * factor);
    }
}
"""

THREADS = 256
CHUNKS = 64


@functools.cache
def _kernel(name: str):
    return torch.cuda._compile_kernel(KERNELS, name)


class ModelNew(nn.Module):
    """scaling_factor / 2 * (x . colsum(W)), which equals sum(x . W^T / 2, dim=1, keepdim=True) * scaling_factor."""

    def __init__(self, input_size: int, hidden_size: int, scaling_factor: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden_size, input_size))  # as the reference draws it
        self.scaling_factor = float(scaling_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w = self.weight.contiguous()
        hidden, cols = w.shape
        if x.dim() != 2 or x.shape[1] != cols or cols % 4:
            raise ValueError(f"expected x of shape (batch, {cols}) with a multiple of 4 features, got {tuple(x.shape)}")
        batch = x.shape[0]
        chunks = min(CHUNKS, hidden)
        per_chunk = (hidden + chunks - 1) // chunks
        part = torch.empty(chunks, cols, device=x.device, dtype=torch.float32)
        c = torch.empty(cols, device=x.device, dtype=torch.float64)
        out = torch.empty(batch, 1, device=x.device, dtype=torch.float32)
        stream = torch.cuda.current_stream()
        _kernel("colsum_chunks")(grid=((cols // 4 + THREADS - 1) // THREADS, chunks, 1), block=(THREADS, 1, 1),
                                 args=[w, part, hidden, cols, per_chunk], stream=stream)
        _kernel("colsum_finish")(grid=((cols + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1),
                                 args=[part, c, cols, chunks], stream=stream)
        _kernel("row_dot_scaled")(grid=(batch, 1, 1), block=(THREADS, 1, 1),
                                  args=[x, c, out, cols, self.scaling_factor * 0.5], stream=stream)
        return out
