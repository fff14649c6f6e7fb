// NetVLAD (with or without ghost clusters) in one kernel, float32 FMAs, a block per batch element:
//
//   s = x_b C (N x (K + G)); BatchNorm (running statistics) and softmax over the K + G clusters; a = the
//   first K columns; a_sum = sum over N of a; vlad = a^T x_b (K x D) - a_sum * C2; each cluster's column
//   normalised over D, then the whole (D x K, flattened d K + k) normalised.
//
// Run op by op, each step is a pass over a B N x (K + G) or B x D x K tensor; here x_b (N x D) is read
// twice from memory (once per product, the second time mostly from L2) and nothing else goes out but
// the result. The assignment lives in shared memory, C there too; a warp per four rows of s (lanes along the
// clusters), a thread per two columns of vlad (32 clusters in registers).

#include <cuda_runtime.h>

#include <math.h>
#include <stdexcept>

#define NV_D 512      // feature size
#define NV_K 32       // clusters kept (one per lane)
#define NV_THREADS 256
#define NV_R 4        // rows of s a warp computes together

__device__ __forceinline__ float nv_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float nv_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <int KG>
__global__ void __launch_bounds__(NV_THREADS)
    netvlad(const float* __restrict__ x, const float* __restrict__ clusters, const float* __restrict__ mean,
            const float* __restrict__ var, const float* __restrict__ gamma, const float* __restrict__ beta,
            float eps, const float* __restrict__ clusters2, float* __restrict__ out, int N) {
    constexpr int J = (KG + 31) / 32;  // clusters per lane
    extern __shared__ float sm[];
    float* c = sm;                  // [D][KG]
    float* a = c + NV_D * KG;       // [N][K]: the kept assignment
    float* red = a + N * NV_K;      // [8][K] partial sums, then [K] norms, then the total
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float* xb = x + static_cast<long long>(blockIdx.x) * N * NV_D;
    for (int e = threadIdx.x; e < NV_D * KG; e += NV_THREADS) c[e] = clusters[e];
    __syncthreads();
    // s = x_b C, BatchNorm, softmax over the clusters: a warp per NV_R rows at once, so that each value of C
    // read from shared memory serves NV_R rows, and x read four columns at a time (one broadcast load a row)
    for (int n0 = warp * NV_R; n0 < N; n0 += NV_THREADS / 32 * NV_R) {
        float s[NV_R][J];
#pragma unroll
        for (int r = 0; r < NV_R; ++r)
#pragma unroll
            for (int jj = 0; jj < J; ++jj) s[r][jj] = 0.f;
        const float* rows[NV_R];
#pragma unroll
        for (int r = 0; r < NV_R; ++r)  // past N: a row read again, its result dropped
            rows[r] = xb + static_cast<long long>(min(n0 + r, N - 1)) * NV_D;
        for (int d = 0; d < NV_D; d += 4) {
            float4 xv[NV_R];
#pragma unroll
            for (int r = 0; r < NV_R; ++r) xv[r] = *reinterpret_cast<const float4*>(rows[r] + d);
#pragma unroll
            for (int t = 0; t < 4; ++t) {
#pragma unroll
                for (int jj = 0; jj < J; ++jj) {
                    if (lane + 32 * jj < KG) {
                        const float cv = c[(d + t) * KG + lane + 32 * jj];
#pragma unroll
                        for (int r = 0; r < NV_R; ++r) {
                            const float x = t == 0 ? xv[r].x : t == 1 ? xv[r].y : t == 2 ? xv[r].z : xv[r].w;
                            s[r][jj] = fmaf(x, cv, s[r][jj]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < NV_R; ++r) {
            float mx = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < J; ++jj) {
                const int j = lane + 32 * jj;
                if (j < KG) {
                    s[r][jj] = (s[r][jj] - mean[j]) * (1.0f / sqrtf(var[j] + eps)) * gamma[j] + beta[j];
                    mx = fmaxf(mx, s[r][jj]);
                }
            }
            mx = nv_warp_max(mx);
            float sum = 0.f;
#pragma unroll
            for (int jj = 0; jj < J; ++jj) {
                s[r][jj] = lane + 32 * jj < KG ? expf(s[r][jj] - mx) : 0.f;
                sum += s[r][jj];
            }
            sum = nv_warp_sum(sum);
            if (n0 + r < N) a[(n0 + r) * NV_K + lane] = s[r][0] / sum;  // the first K = 32 clusters: the lane's first
        }
    }
    __syncthreads();
    // vlad = a^T x_b: a thread per columns d0 and d0 + 256, every cluster in registers
    const int d0 = threadIdx.x, d1 = threadIdx.x + NV_THREADS;
    float v0[NV_K], v1[NV_K];
#pragma unroll
    for (int k = 0; k < NV_K; ++k) v0[k] = v1[k] = 0.f;
    float asum = 0.f;  // lane k's a_sum (every warp computes it)
    for (int n = 0; n < N; ++n) {
        const float x0 = xb[static_cast<long long>(n) * NV_D + d0], x1 = xb[static_cast<long long>(n) * NV_D + d1];
        asum += a[n * NV_K + lane];
#pragma unroll
        for (int k = 0; k < NV_K; ++k) {
            const float ak = a[n * NV_K + k];
            v0[k] = fmaf(ak, x0, v0[k]);
            v1[k] = fmaf(ak, x1, v1[k]);
        }
    }
    // minus a_sum x C2, and each cluster's sum of squares over D
#pragma unroll
    for (int k = 0; k < NV_K; ++k) {
        const float sk = __shfl_sync(0xffffffffu, asum, k);
        v0[k] -= sk * clusters2[d0 * NV_K + k];
        v1[k] -= sk * clusters2[d1 * NV_K + k];
        const float sq = nv_warp_sum(v0[k] * v0[k] + v1[k] * v1[k]);
        if (lane == 0) red[warp * NV_K + k] = sq;
    }
    __syncthreads();
    float* norm = red + 8 * NV_K;  // [K], then the total at [K]
    if (threadIdx.x < NV_K) {
        float sq = 0.f;
        for (int w = 0; w < NV_THREADS / 32; ++w) sq += red[w * NV_K + threadIdx.x];
        norm[threadIdx.x] = fmaxf(sqrtf(sq), 1e-12f);  // F.normalize's eps
    }
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int k = 0; k < NV_K; ++k) {
        v0[k] /= norm[k];
        v1[k] /= norm[k];
        tot += v0[k] * v0[k] + v1[k] * v1[k];
    }
    tot = nv_warp_sum(tot);
    if (lane == 0) red[warp] = tot;  // (the partials above are read)
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int w = 0; w < NV_THREADS / 32; ++w) t += red[w];
        norm[NV_K] = fmaxf(sqrtf(t), 1e-12f);
    }
    __syncthreads();
    const float g = norm[NV_K];
    float* o = out + static_cast<long long>(blockIdx.x) * NV_D * NV_K;
#pragma unroll
    for (int k = 0; k < NV_K; k += 4) {
        *reinterpret_cast<float4*>(o + d0 * NV_K + k) =
            make_float4(v0[k] / g, v0[k + 1] / g, v0[k + 2] / g, v0[k + 3] / g);
        *reinterpret_cast<float4*>(o + d1 * NV_K + k) =
            make_float4(v1[k] / g, v1[k + 1] / g, v1[k + 2] / g, v1[k + 3] / g);
    }
}

// The launch: x (B, N, 512), clusters (512, K + G) with K = 32 and G 0 or 16, clusters2 (512, 32), out (B, 512 x 32).
void launch_netvlad(const float* x, const float* clusters, const float* mean, const float* var, const float* gamma,
                    const float* beta, float eps, const float* clusters2, float* out, int B, int N, int KG,
                    void* stream) {
    if (B <= 0) return;
    const size_t smem = (static_cast<size_t>(NV_D) * KG + static_cast<size_t>(N) * NV_K + 9 * NV_K + 1) * sizeof(float);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (KG == 32) {
        mc_check(cudaFuncSetAttribute(netvlad<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                 "netvlad shared memory");
        netvlad<32><<<B, NV_THREADS, smem, s>>>(x, clusters, mean, var, gamma, beta, eps, clusters2, out, N);
    } else if (KG == 48) {
        mc_check(cudaFuncSetAttribute(netvlad<48>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                 "netvlad shared memory");
        netvlad<48><<<B, NV_THREADS, smem, s>>>(x, clusters, mean, var, gamma, beta, eps, clusters2, out, N);
    } else {
        throw std::runtime_error("netvlad: built for 32 clusters and 0 or 16 ghost clusters (level3/46, 47)");
    }
    mc_check(cudaGetLastError(), "netvlad launch");
}
