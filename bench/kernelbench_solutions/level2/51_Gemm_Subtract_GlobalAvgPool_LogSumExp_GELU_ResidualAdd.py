"""Solution for level2/51_Gemm_Subtract_GlobalAvgPool_LogSumExp_GELU_ResidualAdd.py: the exact
algebraic rewrite, then one fused pass for the residual (track fp32).

The reference: y = x . W^T + b (batch x out), y - s, the mean over the out features (keepdim),
logsumexp over that size-1 dimension, GELU, then + x (broadcast over the in features). The mean of
a linear layer's outputs is linear in x: mean_j (x_b . W_j + b_j - s_j) = (x_b . c + sum(b) - sum(s))
/ out with c_k = sum_j W_jk, the column sums of W (recomputed on every call). logsumexp over a
single element is that element (max + log(exp(0)) = v exactly), so
out_bk = x_bk + GELU(v_b), v_b = (x_b . c + sum(b) - sum(s)) / out. The GEMM becomes one read of W;
then one block per row of x computes v_b (double accumulation) and writes the row x_b + GELU(v_b)
while the row is still in cache. Three NVRTC kernels, nothing kept between calls.
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

// c[0..cols) = column sums (the chunks added in double); the extra last block writes
// c[cols] = sum(bias) - sum(subtract).
extern "C" __global__ void colsum_finish(const float* __restrict__ part, const float* __restrict__ bias,
                                         const float* __restrict__ sub, double* __restrict__ c, int cols,
                                         int chunks, int rows) {
    int col_blocks = (cols + blockDim.x - 1) / blockDim.x;
    if ((int)blockIdx.x < col_blocks) {
        int col = blockIdx.x * blockDim.x + threadIdx.x;
        if (col >= cols) return;
        double acc = 0.0;
        for (int k = 0; k < chunks; ++k) acc += (double)part[(size_t)k * cols + col];
        c[col] = acc;
        return;
    }
    __shared__ double partial[1024];
    double acc = 0.0;
    for (int j = threadIdx.x; j < rows; j += blockDim.x) acc += (double)bias[j] - (double)sub[j];
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) c[cols] = partial[0];
}

extern "C" __global__ void mean_gelu_residual(const float* __restrict__ x, const double* __restrict__ c,
                                              float* __restrict__ out, int cols, int out_features) {
    const float* row = x + (size_t)blockIdx.x * cols;
    float* dst = out + (size_t)blockIdx.x * cols;
    double acc = 0.0;
    for (int k = threadIdx.x; k < cols; k += blockDim.x) acc += (double)row[k] * c[k];
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, off);
    __shared__ double partial[32];
    __shared__ float g_shared;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0;
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, off);
        if (lane == 0) {
            float v = (float)((acc + c[cols]) / (double)out_features);  // the mean, as a float like the reference's
            g_shared = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));  // exact (erf) GELU
        }
    }
    __syncthreads();
    float g = g_shared;
    for (int k = threadIdx.x; k < cols; k += blockDim.x) dst[k] = row[k] + g;
}
"""

THREADS = 256
FINISH_THREADS = 1024
CHUNKS = 64


@functools.cache
def _kernel(name: str):
    return torch.cuda._compile_kernel(KERNELS, name)


class ModelNew(nn.Module):
    """x + GELU((x . colsum(W) + sum(b) - sum(s)) / out_features), broadcast over x's features."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        if not bias:
            raise ValueError("this solution is written for the problem's Linear with a bias")
        gemm = nn.Linear(in_features, out_features, bias=True)  # the reference's draws, in its order
        self.weight = gemm.weight
        self.bias = gemm.bias
        self.subtract = nn.Parameter(torch.randn(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w, b, s = self.weight.contiguous(), self.bias.contiguous(), self.subtract.contiguous()
        out_features, cols = w.shape
        if x.dim() != 2 or x.shape[1] != cols or cols % 4:
            raise ValueError(f"expected x of shape (batch, {cols}) with a multiple of 4 features, got {tuple(x.shape)}")
        batch = x.shape[0]
        chunks = min(CHUNKS, out_features)
        per_chunk = (out_features + chunks - 1) // chunks
        part = torch.empty(chunks, cols, device=x.device, dtype=torch.float32)
        c = torch.empty(cols + 1, device=x.device, dtype=torch.float64)
        out = torch.empty_like(x)
        stream = torch.cuda.current_stream()
        _kernel("colsum_chunks")(grid=((cols // 4 + THREADS - 1) // THREADS, chunks, 1), block=(THREADS, 1, 1),
                                 args=[w, part, out_features, cols, per_chunk], stream=stream)
        col_blocks = (cols + FINISH_THREADS - 1) // FINISH_THREADS
        _kernel("colsum_finish")(grid=(col_blocks + 1, 1, 1), block=(FINISH_THREADS, 1, 1),
                                 args=[part, b, s, c, cols, chunks, out_features], stream=stream)
        _kernel("mean_gelu_residual")(grid=(batch, 1, 1), block=(THREADS, 1, 1),
                                      args=[x, c, out, cols, out_features], stream=stream)
        return out
