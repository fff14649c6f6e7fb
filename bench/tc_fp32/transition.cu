// DenseNet's transition layer in one kernel, float32 FMAs: BatchNorm (inference: the running statistics),
// ReLU, a 1 x 1 convolution without bias, 2 x 2 average pooling.
//
// The convolution and the pooling are both linear and the convolution has no bias, so pooling first
// gives the same values (avgpool(conv(z)) = conv(avgpool(z))) with a quarter of the products: a thread
// takes one pooled pixel, normalises, ReLUs and averages its 2 x 2 input pixels in every channel into
// registers, then computes every output channel from them (weights in shared memory, read by the
// whole block at once). The input is read once, the output written once; nothing in between.

#include <cuda_runtime.h>

#include <stdexcept>

template <int CIN, int COUT>
__global__ void __launch_bounds__(256)
    densenet_transition(const float* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ var,
                        const float* __restrict__ gamma, const float* __restrict__ beta, float eps,
                        const float* __restrict__ w, float* __restrict__ y, int H, int W) {
    __shared__ float sw[COUT * CIN];
    __shared__ float sm[CIN], si[CIN], sg[CIN], sb[CIN];
    for (int e = threadIdx.x; e < COUT * CIN; e += blockDim.x) sw[e] = w[e];
    for (int e = threadIdx.x; e < CIN; e += blockDim.x) {
        sm[e] = mean[e];
        si[e] = 1.0f / sqrtf(var[e] + eps);
        sg[e] = gamma[e];
        sb[e] = beta[e];
    }
    __syncthreads();
    const int OH = H / 2, OW = W / 2;
    const long long n = blockIdx.z;
    const int oy = blockIdx.y, ox = blockIdx.x * blockDim.x + threadIdx.x;
    if (ox >= OW) return;
    const long long plane = static_cast<long long>(H) * W;
    float pooled[CIN];
#pragma unroll
    for (int c = 0; c < CIN; ++c) {
        const float* at = x + (n * CIN + c) * plane + static_cast<long long>(2 * oy) * W + 2 * ox;
        const float2 top = *reinterpret_cast<const float2*>(at), bottom = *reinterpret_cast<const float2*>(at + W);
        float sum = 0.f;
        const float v[4] = {top.x, top.y, bottom.x, bottom.y};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float z = (v[i] - sm[c]) * si[c] * sg[c] + sb[c];  // BatchNorm, as torch orders it
            sum += z < 0.f ? 0.f : z;                   // ReLU (NaN stays NaN)
        }
        pooled[c] = sum * 0.25f;
    }
    const long long out_plane = static_cast<long long>(OH) * OW;
    float* out = y + n * COUT * out_plane + static_cast<long long>(oy) * OW + ox;
#pragma unroll 4
    for (int o = 0; o < COUT; ++o) {
        float acc = 0.f;
#pragma unroll
        for (int c = 0; c < CIN; ++c) acc = fmaf(sw[o * CIN + c], pooled[c], acc);
        out[o * out_plane] = acc;
    }
}

// The launch: x (N, cin, H, W) with W even, y (N, cout, H / 2, W / 2); BatchNorm's running mean and
// variance, weight and bias, and eps; w (cout, cin).
void launch_densenet_transition(const float* x, const float* mean, const float* var, const float* gamma,
                                const float* beta, float eps, const float* w, float* y, int N, int cin, int cout,
                                int H, int W, void* stream) {
    if (N <= 0 || H < 2 || W < 2) return;
    const dim3 grid((W / 2 + 255) / 256, H / 2, N);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (cin == 32 && cout == 64) {
        densenet_transition<32, 64><<<grid, 256, 0, s>>>(x, mean, var, gamma, beta, eps, w, y, H, W);
    } else {
        throw std::runtime_error("densenet_transition: built for 32 -> 64 channels (level3/13's sizes) only");
    }
    mc_check(cudaGetLastError(), "densenet_transition launch");
}
