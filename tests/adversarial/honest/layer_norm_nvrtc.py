"""Honest candidate for layer_norm: one block per row, mean and variance in one pass (Welford
merged across threads), weight and bias applied -- so perturbed parameters change the output
exactly as they change the reference's."""

import torch
import torch.nn as nn

KERNEL = r"""
#define THREADS 512
__device__ __forceinline__ void merge(float& n, float& mean, float& m2, float n2, float mean2, float m22) {
    float total = n + n2;
    if (total == 0.0f) return;
    float delta = mean2 - mean;
    mean += delta * (n2 / total);
    m2 += m22 + delta * delta * (n * n2 / total);
    n = total;
}

extern "C" __global__ void layer_norm(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ b, float* __restrict__ y, int cols) {
    __shared__ float s_n[THREADS / 32], s_mean[THREADS / 32], s_m2[THREADS / 32];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    float n = 0.0f, mean = 0.0f, m2 = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) {
        float v = row[c];
        n += 1.0f;
        float d = v - mean;
        mean += d / n;
        m2 += d * (v - mean);
    }
    for (int off = 16; off > 0; off >>= 1) {
        float n2 = __shfl_xor_sync(0xffffffff, n, off);
        float mean2 = __shfl_xor_sync(0xffffffff, mean, off);
        float m22 = __shfl_xor_sync(0xffffffff, m2, off);
        merge(n, mean, m2, n2, mean2, m22);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { s_n[warp] = n; s_mean[warp] = mean; s_m2[warp] = m2; }
    __syncthreads();
    if (warp == 0) {
        n = lane < THREADS / 32 ? s_n[lane] : 0.0f;
        mean = lane < THREADS / 32 ? s_mean[lane] : 0.0f;
        m2 = lane < THREADS / 32 ? s_m2[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) {
            float n2 = __shfl_xor_sync(0xffffffff, n, off);
            float mean2 = __shfl_xor_sync(0xffffffff, mean, off);
            float m22 = __shfl_xor_sync(0xffffffff, m2, off);
            merge(n, mean, m2, n2, mean2, m22);
        }
        if (lane == 0) { s_mean[0] = mean; s_m2[0] = m2 / n; }
    }
    __syncthreads();
    float mu = s_mean[0];
    float inv = rsqrtf(s_m2[0] + 1e-5f);
    for (int c = threadIdx.x; c < cols; c += THREADS) out[c] = (row[c] - mu) * inv * w[c] + b[c];
}
"""


class ModelNew(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=1e-5)  # holds the parameters; the kernel reads them
        self.kernel = torch.cuda._compile_kernel(KERNEL, "layer_norm")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        cols = x.shape[-1]
        self.kernel(
            grid=(x.numel() // cols, 1, 1),
            block=(512, 1, 1),
            args=[x, self.norm.weight, self.norm.bias, out, cols],
        )
        return out
