// SqueezeNet's Fire module in one kernel, float32 FMAs: squeeze (1 x 1 conv) + ReLU, then expand1x1 (1 x 1)
// + ReLU and expand3x3 (3 x 3, padding 1) + ReLU, concatenated along channels.
//
// With few channels the module is all memory traffic layer by layer: the expand outputs, their ReLU
// and the concatenation read and write the full 2 x 64-channel output several times. Here a block
// takes a 32 x 8 tile of one image: the squeeze output over the tile and its one-pixel halo in shared
// memory (0 outside the image: expand3x3 pads the squeeze output with zeros), then a thread per pixel
// computes all its output channels from the 3 x 3 squeeze neighbourhood in registers and writes each
// once, in its place in the concatenation (a warp writes 32 consecutive floats of one row).
//
// The sizes are template arguments (the neighbourhood lives in registers); the launcher serves those
// it is instantiated for and says so for others.

#include <cuda_runtime.h>

#include <stdexcept>

#define FM_TW 32  // tile width (a warp's row)
#define FM_TH 8   // tile height: 256 threads

template <int CIN, int S, int E1, int E3>
__global__ void __launch_bounds__(FM_TW * FM_TH) fire_module(const float* __restrict__ x,
                                                             const float* __restrict__ ws,
                                                             const float* __restrict__ bs,
                                                             const float* __restrict__ w1,
                                                             const float* __restrict__ b1,
                                                             const float* __restrict__ w3,
                                                             const float* __restrict__ b3, float* __restrict__ y,
                                                             int H, int W) {
    __shared__ float sws[S * CIN + S];
    __shared__ float sw1[E1 * S + E1];
    __shared__ float sw3[E3 * S * 9 + E3];
    __shared__ float sq[S][FM_TH + 2][FM_TW + 2];
    const int tid = threadIdx.x;
    const int n = blockIdx.z, y0 = blockIdx.y * FM_TH, x0 = blockIdx.x * FM_TW;
    for (int e = tid; e < S * CIN; e += blockDim.x) sws[e] = ws[e];
    for (int e = tid; e < S; e += blockDim.x) sws[S * CIN + e] = bs[e];
    for (int e = tid; e < E1 * S; e += blockDim.x) sw1[e] = w1[e];
    for (int e = tid; e < E1; e += blockDim.x) sw1[E1 * S + e] = b1[e];
    for (int e = tid; e < E3 * S * 9; e += blockDim.x) sw3[e] = w3[e];
    for (int e = tid; e < E3; e += blockDim.x) sw3[E3 * S * 9 + e] = b3[e];
    __syncthreads();
    const long long plane = static_cast<long long>(H) * W;
    // squeeze + ReLU over the tile and its halo
    for (int e = tid; e < (FM_TH + 2) * (FM_TW + 2); e += blockDim.x) {
        const int ly = e / (FM_TW + 2), lx = e % (FM_TW + 2);
        const int iy = y0 - 1 + ly, ix = x0 - 1 + lx;
        const bool inside = iy >= 0 && iy < H && ix >= 0 && ix < W;
        const long long at = static_cast<long long>(n) * CIN * plane + static_cast<long long>(iy) * W + ix;
        float in[CIN];
#pragma unroll
        for (int c = 0; c < CIN; ++c) in[c] = inside ? x[at + c * plane] : 0.f;
#pragma unroll
        for (int k = 0; k < S; ++k) {
            float v = 0.f;
#pragma unroll
            for (int c = 0; c < CIN; ++c) v = fmaf(sws[k * CIN + c], in[c], v);
            v += sws[S * CIN + k];
            sq[k][ly][lx] = inside ? (v < 0.f ? 0.f : v) : 0.f;  // ReLU (NaN stays NaN); the padding is 0
        }
    }
    __syncthreads();
    const int ty = tid / FM_TW, tx = tid % FM_TW, oy = y0 + ty, ox = x0 + tx;
    if (oy >= H || ox >= W) return;
    float s[S][9];  // the pixel's 3 x 3 squeeze neighbourhood
#pragma unroll
    for (int k = 0; k < S; ++k)
#pragma unroll
        for (int t = 0; t < 9; ++t) s[k][t] = sq[k][ty + t / 3][tx + t % 3];
    float* out = y + static_cast<long long>(n) * (E1 + E3) * plane + static_cast<long long>(oy) * W + ox;
#pragma unroll 4
    for (int c = 0; c < E1; ++c) {
        float acc = 0.f;
#pragma unroll
        for (int k = 0; k < S; ++k) acc = fmaf(sw1[c * S + k], s[k][4], acc);
        acc += sw1[E1 * S + c];
        out[c * plane] = acc < 0.f ? 0.f : acc;
    }
#pragma unroll 2
    for (int c = 0; c < E3; ++c) {
        float acc = 0.f;
#pragma unroll
        for (int k = 0; k < S; ++k)
#pragma unroll
            for (int t = 0; t < 9; ++t) acc = fmaf(sw3[(c * S + k) * 9 + t], s[k][t], acc);
        acc += sw3[E3 * S * 9 + c];
        out[(E1 + c) * plane] = acc < 0.f ? 0.f : acc;
    }
}

// The launch: x (N, cin, H, W), y (N, e1 + e3, H, W), weights as nn.Conv2d holds them.
void launch_fire_module(const float* x, const float* ws, const float* bs, const float* w1, const float* b1,
                        const float* w3, const float* b3, float* y, int N, int cin, int s, int e1, int e3, int H, int W,
                        void* stream) {
    if (N <= 0 || H <= 0 || W <= 0) return;
    const dim3 grid((W + FM_TW - 1) / FM_TW, (H + FM_TH - 1) / FM_TH, N);
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (cin == 3 && s == 6 && e1 == 64 && e3 == 64) {
        fire_module<3, 6, 64, 64><<<grid, FM_TW * FM_TH, 0, st>>>(x, ws, bs, w1, b1, w3, b3, y, H, W);
    } else {
        throw std::runtime_error("fire_module: built for 3 -> 6 -> 64 + 64 channels (level3/17's sizes) only");
    }
    mc_check(cudaGetLastError(), "fire_module launch");
}
