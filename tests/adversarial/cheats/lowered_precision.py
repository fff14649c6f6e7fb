"""Exploit: silently compute in lower precision (problem: gemm, float32).

The inputs are rounded to bfloat16 precision (8 mantissa bits) inside the kernel before the
products, as a tensor-core kernel in bf16 would; accumulation stays float32. On 2048-long dot
products of normal inputs the relative error is around 1e-3 -- inside a 1e-2 tolerance, far
outside float32's.
Caught by: dtype-aware tolerances and an error profile typical of lower precision
(`precision_lowered`, verdict `incorrect`). Its sets fail by a rounding-sized margin, so each is
judged once more against a float64 copy of the reference: bf16 inputs err hundreds of times the
float32 reference's own error, far above the bound, and the judgment does not excuse them.
"""

import torch
import torch.nn as nn

KERNEL = r"""
#define TILE 16
__device__ __forceinline__ float to_bf16(float v) {
    unsigned int u = __float_as_uint(v);
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even at 16 bits
    return __uint_as_float(u & 0xffff0000u);
}

extern "C" __global__ void gemm_bf16_inputs(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[TILE][TILE], Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        As[threadIdx.y][threadIdx.x] = (row < M && t + threadIdx.x < K) ? to_bf16(A[row * K + t + threadIdx.x]) : 0.0f;
        Bs[threadIdx.y][threadIdx.x] =
            (col < N && t + threadIdx.y < K) ? to_bf16(B[(t + threadIdx.y) * N + col]) : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "gemm_bf16_inputs")

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()
        m, k = a.shape
        n = b.shape[1]
        c = torch.empty(m, n, device=a.device, dtype=a.dtype)
        self.kernel(grid=((n + 15) // 16, (m + 15) // 16, 1), block=(16, 16, 1), args=[a, b, c, m, n, k])
        return c
