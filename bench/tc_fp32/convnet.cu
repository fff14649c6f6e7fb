// A convolutional network's layers beside the GEMM core: each convolution is an implicit GEMM made
// explicit, its input unfolded into rows (`unfold`: one row per output pixel, K = KH KW C columns in
// (kh, kw, c) order, padded with zeros to a multiple of 4) and multiplied by the weights laid out the same
// way (`conv_weights`) on the 3xTF32 core, with the bias and ReLU in its epilogue. The product's rows
// are the output pixels in (n, y, x) order and its columns the channels: the activations stay
// channels-last (N, H, W, C) from the first convolution on, so each unfold reads runs of consecutive
// channels and each max pooling (`maxpool_nhwc`) reads and writes whole channel runs. `nhwc_flatten`
// gives the classifier the reference's flatten order (c, y, x).

#include <cuda_runtime.h>

#include <math.h>

namespace {
unsigned cn_blocks(long long items, int per_block) {
    const long long b = (items + per_block - 1) / per_block;
    return static_cast<unsigned>(b < 65535LL * 32 ? b : 65535LL * 32);  // grid-stride loops cover the rest
}
}  // namespace

// cols[m][k], m = (n OH + oy) OW + ox, k = (kh KW + kw) C + c (k < KH KW C; zeros up to Kp): the input
// pixel (n, c, oy stride - pad + kh, ox stride - pad + kw), 0 outside the image. A warp per row, lanes
// along k (consecutive channels: coalesced from a channels-last input). The input is read through its
// strides, so channels-first (the model's input) and channels-last (every later layer) are both served.
extern "C" __global__ void unfold(const float* __restrict__ in, float* __restrict__ cols, int N, int C, int H, int W,
                                  int OH, int OW, int KH, int KW, int stride, int pad, int Kp, long long sn,
                                  long long sc, long long sy, long long sx) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, K = KH * KW * C;
    const long long M = static_cast<long long>(N) * OH * OW;
    const long long step = static_cast<long long>(gridDim.x) * 8;
    for (long long m = static_cast<long long>(blockIdx.x) * 8 + warp; m < M; m += step) {
        const int ox = static_cast<int>(m % OW), oy = static_cast<int>((m / OW) % OH);
        const float* base = in + (m / (static_cast<long long>(OW) * OH)) * sn;
        float* row = cols + m * Kp;
        int tap = lane / C, c = lane % C;  // of k = lane, then stepped by 32
        for (int k = lane; k < Kp; k += 32) {
            float v = 0.f;
            if (k < K) {
                const int iy = oy * stride - pad + tap / KW, ix = ox * stride - pad + tap % KW;
                if (iy >= 0 && iy < H && ix >= 0 && ix < W) v = base[c * sc + iy * sy + ix * sx];
            }
            row[k] = v;
            if (C >= 32) {  // at most one wrap per step
                c += 32;
                if (c >= C) {
                    c -= C;
                    ++tap;
                }
            } else {
                tap = (k + 32) / C;
                c = (k + 32) - tap * C;
            }
        }
    }
}

// w (O, C, KH, KW) as rows of Kp in the unfold's (kh, kw, c) order, zeros past KH KW C.
extern "C" __global__ void conv_weights(const float* __restrict__ w, float* __restrict__ out, int O, int C, int KH,
                                        int KW, int Kp) {
    const long long total = static_cast<long long>(O) * Kp;
    const int K = KH * KW * C;
    for (long long e = blockIdx.x * 256LL + threadIdx.x; e < total; e += static_cast<long long>(gridDim.x) * 256) {
        const int k = static_cast<int>(e % Kp);
        const long long o = e / Kp;
        const int c = k % C, tap = k / C;
        out[e] = k < K ? w[((o * C + c) * KH + tap / KW) * KW + tap % KW] : 0.f;
    }
}

__device__ __forceinline__ float cn_max(float a, float b) { return (a != a || a > b) ? a : b; }  // NaN wins

// (N, H, W, C) -> (N, OH, OW, C): the maximum of each k x k window at stride s, padded by pad (a padded
// place is never the maximum, as torch's -inf padding; NaN propagates, as torch's).
extern "C" __global__ void maxpool_nhwc(const float* __restrict__ in, float* __restrict__ out, int N, int H, int W,
                                        int C, int k, int s, int pad, int OH, int OW) {
    const long long total = static_cast<long long>(N) * OH * OW * C;
    for (long long e = blockIdx.x * 256LL + threadIdx.x; e < total; e += static_cast<long long>(gridDim.x) * 256) {
        const int c = static_cast<int>(e % C);
        const long long p = e / C;
        const int ox = static_cast<int>(p % OW), oy = static_cast<int>((p / OW) % OH);
        const long long n = p / (static_cast<long long>(OW) * OH);
        const int y0 = oy * s - pad, x0 = ox * s - pad;
        float v = -INFINITY;
        for (int y = max(y0, 0); y < min(y0 + k, H); ++y)
            for (int x = max(x0, 0); x < min(x0 + k, W); ++x) v = cn_max(v, in[((n * H + y) * W + x) * C + c]);
        out[e] = v;
    }
}

// (N, C, HW) -> (N, HW, C) through 32 x 32 shared tiles: reads along HW, writes along C, both coalesced.
extern "C" __global__ void nchw_to_nhwc(const float* __restrict__ in, float* __restrict__ out, int C, int HW) {
    __shared__ float tile[32][33];
    const long long n = blockIdx.z;
    const int p0 = blockIdx.x * 32, c0 = blockIdx.y * 32, tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (int r = ty; r < 32; r += blockDim.x / 32) {
        const int c = c0 + r, p = p0 + tx;
        tile[r][tx] = c < C && p < HW ? in[(n * C + c) * HW + p] : 0.f;
    }
    __syncthreads();
    for (int r = ty; r < 32; r += blockDim.x / 32) {
        const int p = p0 + r, c = c0 + tx;
        if (p < HW && c < C) out[(n * HW + p) * C + c] = tile[tx][r];
    }
}

// Channels-last parts, side by side along channels, as one channels-first (N, C, HW) output: part i
// holds channels [first[i], first[i + 1]) at src[i] + (n HW + p) stride[i] + (c - first[i]).
struct CnParts {
    const float* src[4];
    long long stride[4];
    int first[5];
};

extern "C" __global__ void concat_to_nchw(CnParts parts, float* __restrict__ out, int C, int HW) {
    __shared__ float tile[32][33];
    const long long n = blockIdx.z;
    const int p0 = blockIdx.x * 32, c0 = blockIdx.y * 32, tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (int r = ty; r < 32; r += blockDim.x / 32) {  // row r: pixel p0 + r, lanes along channels
        const int p = p0 + r, c = c0 + tx;
        float v = 0.f;
        if (p < HW && c < C) {
            const float* src = parts.src[0];
            long long stride = parts.stride[0];
            int first = parts.first[0];
#pragma unroll
            for (int j = 1; j < 4; ++j) {  // (unrolled: no local copy of the parts)
                if (c >= parts.first[j]) {
                    src = parts.src[j];
                    stride = parts.stride[j];
                    first = parts.first[j];
                }
            }
            v = src[(n * HW + p) * stride + (c - first)];
        }
        tile[r][tx] = v;
    }
    __syncthreads();
    for (int r = ty; r < 32; r += blockDim.x / 32) {  // row r: channel c0 + r, lanes along pixels
        const int c = c0 + r, p = p0 + tx;
        if (p < HW && c < C) out[(n * C + c) * HW + p] = tile[tx][r];
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

void launch_unfold(const float* in, float* cols, int N, int C, int H, int W, int OH, int OW, int KH, int KW,
                   int stride, int pad, int Kp, long long sn, long long sc, long long sy, long long sx, void* stream) {
    unfold<<<cn_blocks(1LL * N * OH * OW, 8), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        in, cols, N, C, H, W, OH, OW, KH, KW, stride, pad, Kp, sn, sc, sy, sx);
    mc_check(cudaGetLastError(), "unfold launch");
}

void launch_conv_weights(const float* w, float* out, int O, int C, int KH, int KW, int Kp, void* stream) {
    conv_weights<<<cn_blocks(1LL * O * Kp, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(w, out, O, C, KH, KW,
                                                                                               Kp);
    mc_check(cudaGetLastError(), "conv_weights launch");
}

void launch_maxpool_nhwc(const float* in, float* out, int N, int H, int W, int C, int k, int s, int pad, int OH,
                         int OW, void* stream) {
    maxpool_nhwc<<<cn_blocks(1LL * N * OH * OW * C, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        in, out, N, H, W, C, k, s, pad, OH, OW);
    mc_check(cudaGetLastError(), "maxpool_nhwc launch");
}

void launch_nchw_to_nhwc(const float* in, float* out, int N, int C, int HW, void* stream) {
    const dim3 grid((HW + 31) / 32, (C + 31) / 32, N);
    nchw_to_nhwc<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, C, HW);
    mc_check(cudaGetLastError(), "nchw_to_nhwc launch");
}

void launch_concat_to_nchw(const float* const* src, const long long* stride, const int* first, int parts, float* out,
                           int N, int C, int HW, void* stream) {
    CnParts p{};
    for (int i = 0; i < 4; ++i) {
        p.src[i] = src[i < parts ? i : parts - 1];
        p.stride[i] = stride[i < parts ? i : parts - 1];
    }
    for (int i = 0; i <= 4; ++i) p.first[i] = i <= parts ? first[i] : C;
    const dim3 grid((HW + 31) / 32, (C + 31) / 32, N);
    concat_to_nchw<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(p, out, C, HW);
    mc_check(cudaGetLastError(), "concat_to_nchw launch");
}

void launch_nhwc_flatten(const float* in, float* out, int N, int H, int W, int C, void* stream) {
    nhwc_flatten<<<cn_blocks(1LL * N * H * W * C, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, N, H,
                                                                                                      W, C);
    mc_check(cudaGetLastError(), "nhwc_flatten launch");
}

// count floats from src to dst on the stream (the copy engine: no kernel).
void launch_copy(float* dst, const float* src, long long count, void* stream) {
    mc_check(cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDeviceToDevice,
                             static_cast<cudaStream_t>(stream)), "copy");
}
