// VGG's layers beside the GEMM core: each 3 x 3 convolution (padding 1) is an implicit GEMM made explicit,
// its input unfolded into rows (`unfold3x3`: one row per output pixel, K = 9 C columns in (kh, kw, c)
// order, padded with zeros to a multiple of 4) and multiplied by the weights laid out the same way
// (`conv_weights`) on the 3xTF32 core, with the bias and ReLU in its epilogue. The product's rows are
// the pixels in (n, y, x) order and its columns the channels: the activations stay channels-last
// (N, H, W, C) from the first convolution on, so each unfold reads consecutive channels and each
// pooling (`maxpool2_nhwc`, 2 x 2, stride 2) reads and writes whole channel runs. `nhwc_flatten` gives
// the classifier the reference's flatten order (c, y, x).

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace {
void vgg_check(const char* what) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(std::string(what) + " launch: " + cudaGetErrorString(err));
}

unsigned vgg_blocks(long long n) {
    const long long b = (n + 255) / 256;
    return static_cast<unsigned>(b < 65535LL * 32 ? b : 65535LL * 32);  // grid-stride loops cover the rest
}
}  // namespace

// cols[m][k], m = (n H + y) W + x, k = (kh 3 + kw) C + c (k < 9 C; zeros up to Kp): the input pixel
// (n, c, y + kh - 1, x + kw - 1), 0 outside the image. The input is read through its strides, so
// channels-first (the model's input) and channels-last (every later layer) are both served.
extern "C" __global__ void unfold3x3(const float* __restrict__ in, float* __restrict__ cols, int N, int C, int H, int W,
                                     int Kp, long long sn, long long sc, long long sy, long long sx) {
    const long long total = static_cast<long long>(N) * H * W * Kp;
    for (long long e = blockIdx.x * 256LL + threadIdx.x; e < total; e += static_cast<long long>(gridDim.x) * 256) {
        const int k = static_cast<int>(e % Kp);
        const long long m = e / Kp;
        const int x = static_cast<int>(m % W), y = static_cast<int>((m / W) % H);
        const int n = static_cast<int>(m / (1LL * W * H));
        float v = 0.f;
        if (k < 9 * C) {
            const int c = k % C, tap = k / C, iy = y + tap / 3 - 1, ix = x + tap % 3 - 1;
            if (iy >= 0 && iy < H && ix >= 0 && ix < W) v = in[n * sn + c * sc + iy * sy + ix * sx];
        }
        cols[e] = v;
    }
}

// w (O, C, 3, 3) as rows of Kp in the unfold's (kh, kw, c) order, zeros past 9 C.
extern "C" __global__ void conv_weights(const float* __restrict__ w, float* __restrict__ out, int O, int C, int Kp) {
    const long long total = static_cast<long long>(O) * Kp;
    for (long long e = blockIdx.x * 256LL + threadIdx.x; e < total; e += static_cast<long long>(gridDim.x) * 256) {
        const int k = static_cast<int>(e % Kp);
        const long long o = e / Kp;
        out[e] = k < 9 * C ? w[(o * C + k % C) * 9 + k / C] : 0.f;
    }
}

__device__ __forceinline__ float vgg_max(float a, float b) { return (a != a || a > b) ? a : b; }  // NaN wins

// (N, H, W, C) -> (N, H / 2, W / 2, C): the maximum of each 2 x 2 window (NaN propagates, as torch's).
extern "C" __global__ void maxpool2_nhwc(const float* __restrict__ in, float* __restrict__ out, int N, int H, int W,
                                         int C) {
    const int OH = H / 2, OW = W / 2;
    const long long total = static_cast<long long>(N) * OH * OW * C;
    for (long long e = blockIdx.x * 256LL + threadIdx.x; e < total; e += static_cast<long long>(gridDim.x) * 256) {
        const int c = static_cast<int>(e % C);
        const long long p = e / C;
        const int ox = static_cast<int>(p % OW), oy = static_cast<int>((p / OW) % OH);
        const long long n = p / (1LL * OW * OH);
        const float* at = in + ((n * H + 2 * oy) * W + 2 * ox) * C + c;
        out[e] = vgg_max(vgg_max(at[0], at[C]), vgg_max(at[static_cast<long long>(W) * C],
                                                         at[static_cast<long long>(W) * C + C]));
    }
}

// (N, H, W, C) -> (N, C H W) in the reference's flatten order (c, y, x).
extern "C" __global__ void nhwc_flatten(const float* __restrict__ in, float* __restrict__ out, int N, int H, int W,
                                        int C) {
    const long long total = static_cast<long long>(N) * H * W * C;
    for (long long e = blockIdx.x * 256LL + threadIdx.x; e < total; e += static_cast<long long>(gridDim.x) * 256) {
        const int x = static_cast<int>(e % W), y = static_cast<int>((e / W) % H);
        const int c = static_cast<int>((e / (1LL * W * H)) % C);
        const long long n = e / (1LL * W * H * C);
        out[e] = in[((n * H + y) * W + x) * C + c];
    }
}

void launch_unfold3x3(const float* in, float* cols, int N, int C, int H, int W, int Kp, long long sn, long long sc,
                      long long sy, long long sx, void* stream) {
    unfold3x3<<<vgg_blocks(1LL * N * H * W * Kp), 256, 0, static_cast<cudaStream_t>(stream)>>>(in, cols, N, C, H, W,
                                                                                                  Kp, sn, sc, sy, sx);
    vgg_check("unfold3x3");
}

void launch_conv_weights(const float* w, float* out, int O, int C, int Kp, void* stream) {
    conv_weights<<<vgg_blocks(1LL * O * Kp), 256, 0, static_cast<cudaStream_t>(stream)>>>(w, out, O, C, Kp);
    vgg_check("conv_weights");
}

void launch_maxpool2_nhwc(const float* in, float* out, int N, int H, int W, int C, void* stream) {
    maxpool2_nhwc<<<vgg_blocks(1LL * N * (H / 2) * (W / 2) * C), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        in, out, N, H, W, C);
    vgg_check("maxpool2_nhwc");
}

void launch_nhwc_flatten(const float* in, float* out, int N, int H, int W, int C, void* stream) {
    nhwc_flatten<<<vgg_blocks(1LL * N * H * W * C), 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, N, H, W, C);
    vgg_check("nhwc_flatten");
}
