// Causal ReLU attention, fused, on the tensor cores at float32 accuracy (3xTF32 `mma.sync m16n8k8`).
//
// y[b, i, h, :] = sum over j <= i of relu(scale * q[b, i, h, :] . k[b, j, h, :]) * v[b, j, h, :]
// with q, k and v read in place from the Linear's output qkv (B, T, 3C: q, then k, then v, each C = H x 64
// wide), y written as (B, T, C). ReLU needs no row-wise normalisation, so each key block's scores are
// made, masked and used in registers and never stored: the T x T score matrix never exists.
//
// A block of 128 threads takes 64 query rows of one (batch, head), a warp 16 of them, and walks the
// key blocks of 64 up to its diagonal (the causal mask makes the rest zero), the heaviest row blocks
// first. Per key block: K and V tiles staged in shared memory (rows padded so the fragment reads hit 32
// distinct banks), S = Q K^T on the tensor cores, scaled, masked and ReLU'd in registers, then Y += S V
// with S's accumulator fragments moved into operand fragments by warp shuffles. The 3xTF32 products and
// the fragment moves are mma_3xtf32.cu's (put before this file).

#include <cuda_runtime.h>

#define RA_BM 64       // query rows per block
#define RA_BN 64       // keys per key block
#define RA_D 64        // head size
#define RA_KS (RA_D + 4)  // K tile row stride: (g * 68 + t) % 32 is distinct over a warp
#define RA_VS (RA_D + 8)  // V tile row stride: (t * 72 + g) % 32 is distinct over a warp

extern "C" __global__ void __launch_bounds__(128) relu_attention_3xtf32(const float* __restrict__ qkv,
                                                                        float* __restrict__ y, int T, int C, int H,
                                                                        float scale) {
    __shared__ __align__(16) float ks[RA_BN * RA_KS];
    __shared__ __align__(16) float vs[RA_BN * RA_VS];
    const int rb = gridDim.x - 1 - blockIdx.x;  // the longest row blocks (most key blocks) start first
    const int b = blockIdx.y / H, h = blockIdx.y % H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long long row_stride = 3LL * C;
    const float* base = qkv + static_cast<long long>(b) * T * row_stride + h * RA_D;
    const int q0 = rb * RA_BM + warp * 16;  // this warp's first query row

    // The warp's Q rows as A fragments, split once: 8 chunks of 8 head dims.
    unsigned qh[8][4], ql[8][4];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        const float* r0 = base + static_cast<long long>(q0 + g) * row_stride + 8 * c + t;
        const float* r1 = r0 + 8 * row_stride;
        tc3_split(r0[0], qh[c][0], ql[c][0]);
        tc3_split(r1[0], qh[c][1], ql[c][1]);
        tc3_split(r0[4], qh[c][2], ql[c][2]);
        tc3_split(r1[4], qh[c][3], ql[c][3]);
    }
    float acc[8][4];  // Y's 16 x 64: 8 tiles of 8 head dims
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;

    for (int kb = 0; kb <= rb; ++kb) {
        __syncthreads();  // the previous key block's tiles are no longer read
        const float* kbase = base + static_cast<long long>(kb * RA_BN) * row_stride + C;
        for (int e = threadIdx.x; e < RA_BN * RA_D / 4; e += blockDim.x) {
            const int r = e / (RA_D / 4), c4 = (e % (RA_D / 4)) * 4;
            const float4 kv = *reinterpret_cast<const float4*>(kbase + static_cast<long long>(r) * row_stride + c4);
            const float4 vv = *reinterpret_cast<const float4*>(kbase + static_cast<long long>(r) * row_stride + C + c4);
            *reinterpret_cast<float4*>(&ks[r * RA_KS + c4]) = kv;
            *reinterpret_cast<float4*>(&vs[r * RA_VS + c4]) = vv;
        }
        __syncthreads();
        const bool diagonal = kb == rb;
        // S = Q K^T for the warp's 16 rows and the block's 64 keys: 8 tiles of 8 keys.
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) s[j][i] = 0.f;
            // on the diagonal, key tiles past the warp's last row are all masked: skipped
            if (diagonal && 8 * j > warp * 16 + 15) continue;
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                unsigned bh[2], bl[2];
                tc3_split(ks[(8 * j + g) * RA_KS + 8 * c + t], bh[0], bl[0]);
                tc3_split(ks[(8 * j + g) * RA_KS + 8 * c + t + 4], bh[1], bl[1]);
                tc3_mma3(s[j], qh[c], ql[c], bh, bl);
            }
        }
        // scale, the causal mask (a masked score is -inf, which ReLU makes 0) and ReLU (NaN stays NaN)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int qi = q0 + g + (i >= 2 ? 8 : 0);
                const int kj = kb * RA_BN + 8 * j + 2 * t + (i & 1);
                const float x = s[j][i] * scale;
                s[j][i] = kj > qi ? 0.f : (x < 0.f ? 0.f : x);
            }
        // Y += S V: S's tile j is the A operand of key chunk j.
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            if (diagonal && 8 * c > warp * 16 + 15) continue;  // all zero
            unsigned ah[4], al[4];
            tc3_c_to_a(s[c], ah, al);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                unsigned bh[2], bl[2];
                tc3_split(vs[(8 * c + t) * RA_VS + 8 * j + g], bh[0], bl[0]);
                tc3_split(vs[(8 * c + t + 4) * RA_VS + 8 * j + g], bh[1], bl[1]);
                tc3_mma3(acc[j], ah, al, bh, bl);
            }
        }
    }
    float* out = y + (static_cast<long long>(b) * T + q0 + g) * C + h * RA_D + 2 * t;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        *reinterpret_cast<float2*>(out + 8 * j) = make_float2(acc[j][0], acc[j][1]);
        *reinterpret_cast<float2*>(out + 8 * static_cast<long long>(C) + 8 * j) = make_float2(acc[j][2], acc[j][3]);
    }
}

// The launch: qkv (B, T, 3C) contiguous, y (B, T, C); T % 64 == 0 and C == 64 H (the caller checks).
void launch_relu_attention(const float* qkv, float* y, int B, int T, int C, int H, float scale, void* stream) {
    if (B <= 0 || T <= 0) return;
    const dim3 grid(T / RA_BM, B * H);
    relu_attention_3xtf32<<<grid, 128, 0, static_cast<cudaStream_t>(stream)>>>(qkv, y, T, C, H, scale);
    mc_check(cudaGetLastError(), "relu_attention launch");
}
