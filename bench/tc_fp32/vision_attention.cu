// Multi-head self-attention over an image's pixels, as nn.MultiheadAttention (batch_first False) then a
// residual LayerNorm computes it, in three kernels of our own beside the GEMM core (in and out
// projections):
//
// * `to_tokens`: the image (B, C, H, W) as token rows (H W B, C), row l B + n, through a shared tile;
// * `mha_flash_3xtf32`: softmax(q k^T / sqrt(d)) v for every head, flash style (each query block walks
//   every key block with a running maximum and sum, so the L x L scores are never stored), on the
//   tensor cores at float32 accuracy (3xTF32 `mma.sync m16n8k8`: mma_3xtf32.cu's, put before this file);
// * `residual_layernorm`: LayerNorm(attention + x) over the C channels of each token, written back as
//   (B, C, H, W) through a shared tile.
//
// q is scaled before the product, as the reference scales it (q * sqrt(1 / d) in float32), and the
// softmax's exponentials are expf's (not the approximate __expf).

#include <cuda_runtime.h>

#include <math.h>

#define VA_BM 64  // query rows per block of the attention kernel (16 per warp)
#define VA_BN 64  // keys per key block
#define VA_TILE 32  // tokens per block of the layout kernels

// The image (B, C, L) as token rows: tokens[(l B + n) C + c] = x[(n C + c) L + l]. Block: 32 tokens of one
// image, 256 threads; C % 32 == 0.
extern "C" __global__ void __launch_bounds__(256) to_tokens(const float* __restrict__ x, float* __restrict__ tokens,
                                                            int B, int C, int L) {
    extern __shared__ float tile[];  // [C][VA_TILE + 1]
    const int n = blockIdx.y, l0 = blockIdx.x * VA_TILE;
    const float* img = x + static_cast<long long>(n) * C * L;
    for (int e = threadIdx.x; e < C * VA_TILE; e += blockDim.x) {
        const int c = e / VA_TILE, j = e % VA_TILE;  // along l: coalesced reads
        tile[c * (VA_TILE + 1) + j] = l0 + j < L ? img[static_cast<long long>(c) * L + l0 + j] : 0.f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < C * VA_TILE; e += blockDim.x) {
        const int j = e / C, c = e % C;  // along c: coalesced writes
        if (l0 + j < L) tokens[(static_cast<long long>(l0 + j) * B + n) * C + c] = tile[c * (VA_TILE + 1) + j];
    }
}

// softmax(q k^T) v for 64 query rows of one (batch n, head h); qkv rows are tokens (l N + n), 3E wide: q, k,
// v each E = H x HD. out rows the same tokens, E wide, head h at columns h HD.
template <int HD>
__global__ void __launch_bounds__(128) mha_flash_3xtf32(const float* __restrict__ qkv, float* __restrict__ out,
                                                        int L, int N, int E, int H, float scale) {
    constexpr int KC = HD / 8;       // 8-wide chunks of the head dim
    constexpr int KS = HD + 4;       // K tile row stride: (g * KS + t) % 32 distinct over a warp
    constexpr int VS = HD + 8;       // V tile row stride: (t * VS + g) % 32 distinct over a warp
    __shared__ __align__(16) float ks[VA_BN * KS];
    __shared__ __align__(16) float vs[VA_BN * VS];
    const int n = blockIdx.y / H, h = blockIdx.y % H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long long row_stride = static_cast<long long>(N) * 3 * E;  // from token l to token l + 1 of batch n
    const float* base = qkv + static_cast<long long>(n) * 3 * E + h * HD;
    const int q0 = blockIdx.x * VA_BM + warp * 16;

    unsigned qh[KC][4], ql[KC][4];  // the warp's 16 query rows, scaled as the reference scales q, split once
#pragma unroll
    for (int c = 0; c < KC; ++c) {
        const float* r0 = base + (q0 + g) * row_stride + 8 * c + t;
        const float* r1 = r0 + 8 * row_stride;
        tc3_split(r0[0] * scale, qh[c][0], ql[c][0]);
        tc3_split(r1[0] * scale, qh[c][1], ql[c][1]);
        tc3_split(r0[4] * scale, qh[c][2], ql[c][2]);
        tc3_split(r1[4] * scale, qh[c][3], ql[c][3]);
    }
    float acc[KC][4];  // O's 16 x HD: KC tiles of 8 head dims
#pragma unroll
    for (int j = 0; j < KC; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY;  // running maxima of rows g and g + 8
    float l0 = 0.f, l1 = 0.f;              // this thread's share of their running sums

    for (int kb = 0; kb < L / VA_BN; ++kb) {
        __syncthreads();  // the previous key block's tiles are no longer read
        const float* kbase = base + static_cast<long long>(kb) * VA_BN * row_stride + E;
        for (int e = threadIdx.x; e < VA_BN * HD / 4; e += blockDim.x) {
            const int r = e / (HD / 4), c4 = (e % (HD / 4)) * 4;
            const float* src = kbase + r * row_stride + c4;
            *reinterpret_cast<float4*>(&ks[r * KS + c4]) = *reinterpret_cast<const float4*>(src);
            *reinterpret_cast<float4*>(&vs[r * VS + c4]) = *reinterpret_cast<const float4*>(src + E);
        }
        __syncthreads();
        float s[8][4];  // S's 16 x 64: 8 tiles of 8 keys
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) s[j][i] = 0.f;
#pragma unroll
            for (int c = 0; c < KC; ++c) {
                unsigned bh[2], bl[2];
                tc3_split(ks[(8 * j + g) * KS + 8 * c + t], bh[0], bl[0]);
                tc3_split(ks[(8 * j + g) * KS + 8 * c + t + 4], bh[1], bl[1]);
                tc3_mma3(s[j], qh[c], ql[c], bh, bl);
            }
        }
        // the running maxima: over this thread's 16 scores of each row, then over the row's quad
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float alpha0 = expf(m0 - mx0), alpha1 = expf(m1 - mx1);  // 0 on the first block (m = -inf)
        m0 = mx0;
        m1 = mx1;
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            s[j][0] = expf(s[j][0] - m0);
            s[j][1] = expf(s[j][1] - m0);
            s[j][2] = expf(s[j][2] - m1);
            s[j][3] = expf(s[j][3] - m1);
            sum0 += s[j][0] + s[j][1];
            sum1 += s[j][2] + s[j][3];
        }
        l0 = l0 * alpha0 + sum0;
        l1 = l1 * alpha1 + sum1;
#pragma unroll
        for (int j = 0; j < KC; ++j) {
            acc[j][0] *= alpha0;
            acc[j][1] *= alpha0;
            acc[j][2] *= alpha1;
            acc[j][3] *= alpha1;
        }
        // O += P V: P's tile c is the A operand of key chunk c (moved into operand order by shuffles)
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            unsigned ah[4], al[4];
            tc3_c_to_a(s[c], ah, al);
#pragma unroll
            for (int j = 0; j < KC; ++j) {
                unsigned bh[2], bl[2];
                tc3_split(vs[(8 * c + t) * VS + 8 * j + g], bh[0], bl[0]);
                tc3_split(vs[(8 * c + t + 4) * VS + 8 * j + g], bh[1], bl[1]);
                tc3_mma3(acc[j], ah, al, bh, bl);
            }
        }
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const long long out_stride = static_cast<long long>(N) * E;
    float* o = out + (q0 + g) * out_stride + static_cast<long long>(n) * E + h * HD + 2 * t;
#pragma unroll
    for (int j = 0; j < KC; ++j) {
        *reinterpret_cast<float2*>(o + 8 * j) = make_float2(acc[j][0] / l0, acc[j][1] / l0);
        *reinterpret_cast<float2*>(o + 8 * out_stride + 8 * j) = make_float2(acc[j][2] / l1, acc[j][3] / l1);
    }
}

// y (B, C, L) = LayerNorm(a + x) over each token's C channels, a in token rows (l B + n, C), x (B, C, L).
// Block: 32 tokens of one image, 256 threads (a warp per 4 tokens); C % 32 == 0, C <= 1024.
extern "C" __global__ void __launch_bounds__(256) residual_layernorm(const float* __restrict__ a,
                                                                     const float* __restrict__ x,
                                                                     const float* __restrict__ gamma,
                                                                     const float* __restrict__ beta,
                                                                     float* __restrict__ y, int B, int C, int L,
                                                                     float eps) {
    extern __shared__ float tile[];  // [C][VA_TILE + 1]: x's tile, then y's
    const int n = blockIdx.y, l0 = blockIdx.x * VA_TILE;
    const long long img = static_cast<long long>(n) * C * L;
    for (int e = threadIdx.x; e < C * VA_TILE; e += blockDim.x) {
        const int c = e / VA_TILE, j = e % VA_TILE;
        tile[c * (VA_TILE + 1) + j] = l0 + j < L ? x[img + static_cast<long long>(c) * L + l0 + j] : 0.f;
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, per = C / 32;
    for (int j = warp; j < VA_TILE; j += blockDim.x / 32) {
        if (l0 + j >= L) break;
        const float* row = a + (static_cast<long long>(l0 + j) * B + n) * C;
        float sum = 0.f;
        for (int i = 0; i < per; ++i) {
            const int c = lane + 32 * i;
            const float v = row[c] + tile[c * (VA_TILE + 1) + j];
            tile[c * (VA_TILE + 1) + j] = v;
            sum += v;
        }
        for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float mean = sum / C;
        float sq = 0.f;  // the variance from the deviations (two passes: no cancellation)
        for (int i = 0; i < per; ++i) {
            const float d = tile[(lane + 32 * i) * (VA_TILE + 1) + j] - mean;
            sq += d * d;
        }
        for (int o = 16; o > 0; o /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        const float rstd = rsqrtf(sq / C + eps);
        for (int i = 0; i < per; ++i) {
            const int c = lane + 32 * i;
            const float v = tile[c * (VA_TILE + 1) + j];
            tile[c * (VA_TILE + 1) + j] = (v - mean) * rstd * gamma[c] + beta[c];
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < C * VA_TILE; e += blockDim.x) {
        const int c = e / VA_TILE, j = e % VA_TILE;
        if (l0 + j < L) y[img + static_cast<long long>(c) * L + l0 + j] = tile[c * (VA_TILE + 1) + j];
    }
}

// The launches (the C++ wrappers check the shapes): C % 32 == 0 and C <= 1024 for the layout kernels;
// L % 64 == 0 and head size 32 or 64 for the attention.
void launch_to_tokens(const float* x, float* tokens, int B, int C, int L, void* stream) {
    const dim3 grid((L + VA_TILE - 1) / VA_TILE, B);
    to_tokens<<<grid, 256, C * (VA_TILE + 1) * sizeof(float), static_cast<cudaStream_t>(stream)>>>(x, tokens, B, C, L);
    mc_check(cudaGetLastError(), "to_tokens launch");
}

void launch_mha_flash(const float* qkv, float* out, int L, int N, int E, int H, float scale, void* stream) {
    const dim3 grid(L / VA_BM, N * H);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (E / H == 32) {
        mha_flash_3xtf32<32><<<grid, 128, 0, s>>>(qkv, out, L, N, E, H, scale);
    } else {
        mha_flash_3xtf32<64><<<grid, 128, 0, s>>>(qkv, out, L, N, E, H, scale);
    }
    mc_check(cudaGetLastError(), "mha_flash_3xtf32 launch");
}

void launch_residual_layernorm(const float* a, const float* x, const float* gamma, const float* beta, float* y, int B,
                               int C, int L, float eps, void* stream) {
    const dim3 grid((L + VA_TILE - 1) / VA_TILE, B);
    residual_layernorm<<<grid, 256, C * (VA_TILE + 1) * sizeof(float), static_cast<cudaStream_t>(stream)>>>(
        a, x, gamma, beta, y, B, C, L, eps);
    mc_check(cudaGetLastError(), "residual_layernorm launch");
}
