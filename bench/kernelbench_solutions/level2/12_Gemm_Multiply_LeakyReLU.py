"""Solution for level2/12_Gemm_Multiply_LeakyReLU.py: LeakyReLU(Linear(x) * multiplier) in one kernel, on tensor
cores in TF32 (track tf32).

The GEMM (x . W^T, W being the Linear layer's N x K weight, read as it lies) runs on mma.sync
m16n8k8 with TF32 operands and FP32 accumulation; the bias and the elementwise tail are applied to
the accumulators before the only store (epilogue mode 1), so the product never goes to memory
and back. Verified in the tf32 track (tolerance 1e-2).
"""

import functools

import torch
import torch.nn as nn

KERNELS = r"""
// C = epilogue(A . B) on tensor cores: mma.sync m16n8k8 with TF32 inputs and FP32 accumulation.
// A is M x K row-major; B is K x N row-major (gemm_tf32_kn) or N x K row-major (gemm_tf32_nk: a
// Linear layer's weight, or B.T). 128 x 128 block tile, BK = 16, 8 warps of 64 x 32, two shared
// buffers filled from registers (the next tile's global loads overlap the current tile's MMAs).
// Sizes must be multiples of the tiles (M, N of 128, K of 16); the caller checks that.
#define BM 128
#define BN 128
#define BK 16
#define THREADS 256
#define AS_STRIDE (BK + 4)      // 20 words: fragment reads hit 32 distinct banks
#define BKN_STRIDE (BN + 8)     // 136 words: the same for the K x N layout

__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void mma_tf32(float* c, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// mode 0: plain product; 1: (v + bias) * p0, then LeakyReLU(p1); 2: GELU((v + bias) / p0) (erf form);
// 3: ReLU(((v + bias) - p0) * p1).
__device__ __forceinline__ float epilogue(float v, const float* bias, int col, int mode, float p0, float p1) {
    if (mode == 0) return v;
    v += bias[col];
    if (mode == 1) {
        v = v * p0;
        return v > 0.0f ? v : v * p1;
    }
    if (mode == 2) {
        v = v / p0;
        return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
    v = (v - p0) * p1;
    return v > 0.0f ? v : 0.0f;
}

template <bool B_NK>
__device__ __forceinline__ void gemm_tf32_body(const float* __restrict__ A, const float* __restrict__ B,
                                               const float* __restrict__ bias, float* __restrict__ C,
                                               int M, int N, int K, int mode, float p0, float p1) {
    __shared__ __align__(16) unsigned As[2][BM * AS_STRIDE];
    __shared__ __align__(16) unsigned Bs[2][B_NK ? BN * AS_STRIDE : BK * BKN_STRIDE];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int warp_m = warp & 1, warp_n = warp >> 1;  // 2 x 4 warps
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    float4 ra[2], rb[2];
    auto load_global = [&](int k0) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            int idx = tid + j * THREADS;
            int row = idx >> 2, c4 = idx & 3;
            ra[j] = *reinterpret_cast<const float4*>(A + (size_t)(bm + row) * K + k0 + c4 * 4);
            if (B_NK) {
                rb[j] = *reinterpret_cast<const float4*>(B + (size_t)(bn + row) * K + k0 + c4 * 4);
            } else {
                int k = idx >> 5, n4 = idx & 31;
                rb[j] = *reinterpret_cast<const float4*>(B + (size_t)(k0 + k) * N + bn + n4 * 4);
            }
        }
    };
    auto store_shared = [&](int buf) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            int idx = tid + j * THREADS;
            int row = idx >> 2, c4 = idx & 3;
            uint4 va = make_uint4(to_tf32(ra[j].x), to_tf32(ra[j].y), to_tf32(ra[j].z), to_tf32(ra[j].w));
            *reinterpret_cast<uint4*>(&As[buf][row * AS_STRIDE + c4 * 4]) = va;
            uint4 vb = make_uint4(to_tf32(rb[j].x), to_tf32(rb[j].y), to_tf32(rb[j].z), to_tf32(rb[j].w));
            if (B_NK) {
                *reinterpret_cast<uint4*>(&Bs[buf][row * AS_STRIDE + c4 * 4]) = vb;
            } else {
                int k = idx >> 5, n4 = idx & 31;
                *reinterpret_cast<uint4*>(&Bs[buf][k * BKN_STRIDE + n4 * 4]) = vb;
            }
        }
    };

    const int k_tiles = K / BK;
    load_global(0);
    store_shared(0);
    __syncthreads();
    for (int kt = 0; kt < k_tiles; ++kt) {
        const int cur = kt & 1;
        if (kt + 1 < k_tiles) load_global((kt + 1) * BK);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            unsigned a[4][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                int r = warp_m * 64 + mi * 16 + g;
                a[mi][0] = As[cur][r * AS_STRIDE + kk + t];
                a[mi][1] = As[cur][(r + 8) * AS_STRIDE + kk + t];
                a[mi][2] = As[cur][r * AS_STRIDE + kk + t + 4];
                a[mi][3] = As[cur][(r + 8) * AS_STRIDE + kk + t + 4];
            }
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                int n = warp_n * 32 + ni * 8 + g;
                if (B_NK) {
                    b[ni][0] = Bs[cur][n * AS_STRIDE + kk + t];
                    b[ni][1] = Bs[cur][n * AS_STRIDE + kk + t + 4];
                } else {
                    b[ni][0] = Bs[cur][(kk + t) * BKN_STRIDE + n];
                    b[ni][1] = Bs[cur][(kk + t + 4) * BKN_STRIDE + n];
                }
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) mma_tf32(acc[mi][ni], a[mi], b[ni]);
        }
        if (kt + 1 < k_tiles) store_shared(cur ^ 1);
        __syncthreads();
    }

#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
            int row = bm + warp_m * 64 + mi * 16 + g;
            int col = bn + warp_n * 32 + ni * 8 + 2 * t;
            float2 lo = make_float2(epilogue(acc[mi][ni][0], bias, col, mode, p0, p1),
                                    epilogue(acc[mi][ni][1], bias, col + 1, mode, p0, p1));
            float2 hi = make_float2(epilogue(acc[mi][ni][2], bias, col, mode, p0, p1),
                                    epilogue(acc[mi][ni][3], bias, col + 1, mode, p0, p1));
            *reinterpret_cast<float2*>(C + (size_t)row * N + col) = lo;
            *reinterpret_cast<float2*>(C + (size_t)(row + 8) * N + col) = hi;
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) gemm_tf32_kn(
    const float* A, const float* B, const float* bias, float* C, int M, int N, int K, int mode, double p0, double p1) {
    gemm_tf32_body<false>(A, B, bias, C, M, N, K, mode, (float)p0, (float)p1);
}

extern "C" __global__ void __launch_bounds__(THREADS) gemm_tf32_nk(
    const float* A, const float* B, const float* bias, float* C, int M, int N, int K, int mode, double p0, double p1) {
    gemm_tf32_body<true>(A, B, bias, C, M, N, K, mode, (float)p0, (float)p1);
}
"""

TILE_MN = 128
TILE_K = 16


@functools.cache
def _kernel(name: str):
    return torch.cuda._compile_kernel(KERNELS, name)


def _check_tiles(m: int, n: int, k: int) -> None:
    # The kernel has no edge handling: sizes off the tile grid are refused rather than half-computed.
    if m % TILE_MN or n % TILE_MN or k % TILE_K:
        raise ValueError(f"gemm_tf32 needs M, N multiples of {TILE_MN} and K of {TILE_K}, got {(m, n, k)}")


class ModelNew(nn.Module):
    """LeakyReLU(Linear(x) * multiplier)."""

    def __init__(self, in_features, out_features, multiplier, negative_slope) -> None:
        super().__init__()
        lin = nn.Linear(in_features, out_features)  # the reference's initialisation: same seed, same values
        self.weight = lin.weight
        self.bias = lin.bias
        self.p0 = float(multiplier)
        self.p1 = float(negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w, b = self.weight.contiguous(), self.bias.contiguous()
        m, k = x.shape
        n = w.shape[0]
        if w.shape[1] != k:
            raise ValueError(f"expected x with {w.shape[1]} features, got {k}")
        _check_tiles(m, n, k)
        out = torch.empty(m, n, device=x.device, dtype=torch.float32)
        _kernel("gemm_tf32_nk")(grid=(n // TILE_MN, m // TILE_MN, 1), block=(256, 1, 1),
                                args=[x, w, b, out, m, n, k, 1, self.p0, self.p1])
        return out
