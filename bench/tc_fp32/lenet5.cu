// LeNet-5 whole in one kernel, float32 FMAs: conv1 (1 -> 6, 5 x 5) with ReLU and 2 x 2 max pooling, conv2
// (6 -> 16, 5 x 5) with ReLU and pooling, then fc1 (400 -> 120) ReLU, fc2 (120 -> 84) ReLU, fc3 (84 -> classes).
//
// The layers are small and the batch large (thousands of 32 x 32 images): run layer by layer, each
// launch moves a few MB and computes little, and the time is launches and round trips through memory.
// Here a block takes LN_IMG images through every layer in shared memory; only the images are read and
// only the logits written. The pooling takes the maximum of the four ReLU'd sums (ReLU and max commute:
// the same values as pooling after ReLU). The Linear layers go a warp per output row, the row's weights
// read once for all the block's images (coalesced, lanes along K).

#include <cuda_runtime.h>

#define LN_IMG 2        // images per block
#define LN_THREADS 256

struct LeNetWeights {
    const float* c1w; const float* c1b;  // (6, 1, 5, 5), (6)
    const float* c2w; const float* c2b;  // (16, 6, 5, 5), (16)
    const float* f1w; const float* f1b;  // (120, 400), (120)
    const float* f2w; const float* f2b;  // (84, 120), (84)
    const float* f3w; const float* f3b;  // (classes, 84), (classes)
};

// rows x K weights (row-major) times LN_IMG inputs of K in shared memory, plus bias, optionally ReLU'd,
// into LN_IMG outputs of `rows`: a warp per row, lanes along K.
template <bool RELU>
__device__ __forceinline__ void ln_linear(const float* __restrict__ w, const float* __restrict__ b, int rows, int K,
                                          const float* in, float* out, int out_stride, int images) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = warp; r < rows; r += LN_THREADS / 32) {
        float acc[LN_IMG];
#pragma unroll
        for (int i = 0; i < LN_IMG; ++i) acc[i] = 0.f;
#pragma unroll 4  // (fully unrolled, fc1's 13 steps spill)
        for (int k = lane; k < K; k += 32) {
            const float wk = __ldg(w + static_cast<long long>(r) * K + k);
#pragma unroll
            for (int i = 0; i < LN_IMG; ++i) acc[i] = fmaf(wk, in[i * K + k], acc[i]);
        }
#pragma unroll
        for (int i = 0; i < LN_IMG; ++i) {
            float v = acc[i];
#pragma unroll
            for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
            v += __ldg(b + r);
            if (RELU) v = v < 0.f ? 0.f : v;  // NaN stays NaN, as torch's relu
            if (lane == 0 && i < images) out[i * out_stride + r] = v;
        }
    }
}

extern "C" __global__ void __launch_bounds__(LN_THREADS) lenet5_fused(const float* __restrict__ x, LeNetWeights p,
                                                                    float* __restrict__ logits, int batch,
                                                                    int classes) {
    __shared__ float img[LN_IMG * 32 * 32];
    __shared__ float c1w[6 * 25 + 6];
    __shared__ float pool1[LN_IMG * 6 * 14 * 14];
    __shared__ float c2w[16 * 6 * 25 + 16];
    __shared__ float pool2[LN_IMG * 400];
    __shared__ float h1[LN_IMG * 120];
    __shared__ float h2[LN_IMG * 84];
    const int first = blockIdx.x * LN_IMG;
    const int images = min(LN_IMG, batch - first);
    for (int e = threadIdx.x; e < LN_IMG * 1024; e += LN_THREADS)
        img[e] = e < images * 1024 ? x[static_cast<long long>(first) * 1024 + e] : 0.f;
    for (int e = threadIdx.x; e < 6 * 25 + 6; e += LN_THREADS) c1w[e] = e < 150 ? p.c1w[e] : p.c1b[e - 150];
    for (int e = threadIdx.x; e < 16 * 150 + 16; e += LN_THREADS) c2w[e] = e < 2400 ? p.c2w[e] : p.c2b[e - 2400];
    __syncthreads();
    // conv1 + ReLU + pool: (6, 28, 28) -> (6, 14, 14)
    for (int e = threadIdx.x; e < LN_IMG * 6 * 196; e += LN_THREADS) {
        const int i = e / (6 * 196), c = (e / 196) % 6, py = (e % 196) / 14, px = e % 14;
        const float* in = img + i * 1024;
        float best = 0.f;  // ReLU's floor: max(relu(a), relu(b), ...) = max(0, a, b, ...)
        bool nan = false;
#pragma unroll
        for (int dy = 0; dy < 2; ++dy)
#pragma unroll
            for (int dx = 0; dx < 2; ++dx) {
                const int oy = 2 * py + dy, ox = 2 * px + dx;
                float s = 0.f;
#pragma unroll
                for (int ky = 0; ky < 5; ++ky)
#pragma unroll
                    for (int kx = 0; kx < 5; ++kx) s = fmaf(c1w[c * 25 + ky * 5 + kx], in[(oy + ky) * 32 + ox + kx], s);
                s += c1w[150 + c];
                nan |= s != s;
                best = fmaxf(best, s);
            }
        pool1[e] = nan ? __int_as_float(0x7fc00000) : best;
    }
    __syncthreads();
    // conv2 + ReLU + pool: (16, 10, 10) -> (16, 5, 5), flattened as the reference's view: (c, y, x)
    for (int e = threadIdx.x; e < LN_IMG * 400; e += LN_THREADS) {
        const int i = e / 400, c = (e / 25) % 16, py = (e % 25) / 5, px = e % 5;
        const float* in = pool1 + i * 6 * 196;
        const float* w = c2w + c * 150;
        float s00 = 0.f, s01 = 0.f, s10 = 0.f, s11 = 0.f;
        for (int ci = 0; ci < 6; ++ci) {
            const float* plane = in + ci * 196 + (2 * py) * 14 + 2 * px;
#pragma unroll
            for (int ky = 0; ky < 5; ++ky)
#pragma unroll
                for (int kx = 0; kx < 5; ++kx) {
                    const float wk = w[ci * 25 + ky * 5 + kx];
                    s00 = fmaf(wk, plane[ky * 14 + kx], s00);
                    s01 = fmaf(wk, plane[ky * 14 + kx + 1], s01);
                    s10 = fmaf(wk, plane[(ky + 1) * 14 + kx], s10);
                    s11 = fmaf(wk, plane[(ky + 1) * 14 + kx + 1], s11);
                }
        }
        const float b = c2w[2400 + c];
        s00 += b;
        s01 += b;
        s10 += b;
        s11 += b;
        const bool nan = s00 != s00 || s01 != s01 || s10 != s10 || s11 != s11;
        pool2[e] = nan ? __int_as_float(0x7fc00000) : fmaxf(fmaxf(0.f, fmaxf(s00, s01)), fmaxf(s10, s11));
    }
    __syncthreads();
    ln_linear<true>(p.f1w, p.f1b, 120, 400, pool2, h1, 120, LN_IMG);
    __syncthreads();
    ln_linear<true>(p.f2w, p.f2b, 84, 120, h1, h2, 84, LN_IMG);
    __syncthreads();
    ln_linear<false>(p.f3w, p.f3b, classes, 84, h2, logits + static_cast<long long>(first) * classes, classes, images);
}

// The launch: x (batch, 1, 32, 32) contiguous, logits (batch, classes).
void launch_lenet5(const float* x, const LeNetWeights& p, float* logits, int batch, int classes, void* stream) {
    if (batch <= 0) return;
    const int blocks = (batch + LN_IMG - 1) / LN_IMG;
    lenet5_fused<<<blocks, LN_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(x, p, logits, batch, classes);
    mc_check(cudaGetLastError(), "lenet5 launch");
}
