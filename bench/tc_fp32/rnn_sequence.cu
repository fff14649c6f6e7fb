// A vanilla RNN over a whole sequence, h_t = tanh(W_x x_t + W_h h_{t-1} + b), out_t = W_o h_t + b_o, with
// the sequential part in one kernel.
//
// Step by step, every step is a few small launches (the concatenation, two products, tanh) that wait on
// each other. Here the input products of all steps are one GEMM before the loop (x does not depend on
// h) and the output products one GEMM after it, both on the 3xTF32 core; only W_h h_{t-1} is sequential.
// That recurrence runs in one launch: a cluster of 4 blocks per batch row, each block holding its 64
// rows of W_h in shared memory for the whole sequence and computing those 64 hidden units per step,
// which it writes into all four blocks' next-h buffers (distributed shared memory) before the
// cluster's barrier. Batch rows are independent: one cluster each.

#include <cooperative_groups.h>
#include <cuda_runtime.h>

namespace cg = cooperative_groups;

#define RS_HID 256                  // hidden units (4 blocks x 64)
#define RS_SLICE 64                 // hidden units per block
#define RS_WS (RS_HID + 4)          // W_h slice row stride: (4 o + q + 4 i) % 32 distinct over a warp
#define RS_SMEM ((RS_SLICE * RS_WS + 2 * RS_HID) * sizeof(float))

// P (T, B, HID): W_x x_t + b; h0 (B, HID); wh: W_h rows (HID of them, each at stride wh_stride);
// hs (T, B, HID): every h_t. Block (b, rank): hidden units [64 rank, 64 rank + 64) of batch row b.
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(256)
    rnn_recurrence(const float* __restrict__ P, const float* __restrict__ h0, const float* __restrict__ wh,
                   long long wh_stride, float* __restrict__ hs, int T, int B) {
    extern __shared__ float smem[];
    float* w = smem;                      // [64][RS_WS]: w[o][k] = W_h[64 rank + o][k]
    float* hbuf = smem + RS_SLICE * RS_WS;  // [2][RS_HID]: h_{t-1} and h_t
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = static_cast<int>(cluster.block_rank());
    const int b = blockIdx.x / 4;
    for (int e = threadIdx.x; e < RS_SLICE * RS_HID; e += blockDim.x) {
        const int o = e / RS_HID, k = e % RS_HID;
        w[o * RS_WS + k] = wh[(static_cast<long long>(rank) * RS_SLICE + o) * wh_stride + k];
    }
    for (int k = threadIdx.x; k < RS_HID; k += blockDim.x) hbuf[k] = h0[static_cast<long long>(b) * RS_HID + k];
    cluster.sync();  // every block's weights and first h in place before any step reads or writes them
    const int o = threadIdx.x / 4, q = threadIdx.x % 4;  // a quad per hidden unit, k = 4 i + q
    const int unit = rank * RS_SLICE + o;
    for (int t = 0; t < T; ++t) {
        const float* cur = hbuf + (t & 1) * RS_HID;
        float acc = 0.f;
#pragma unroll 16
        for (int i = 0; i < RS_HID / 4; ++i) acc = fmaf(w[o * RS_WS + 4 * i + q], cur[4 * i + q], acc);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        if (q == 0) {
            const long long at = (static_cast<long long>(t) * B + b) * RS_HID + unit;
            const float v = tanhf(P[at] + acc);
            hs[at] = v;
            const int next = ((t + 1) & 1) * RS_HID + unit;
#pragma unroll
            for (int r = 0; r < 4; ++r) cluster.map_shared_rank(hbuf, r)[next] = v;
        }
        cluster.sync();  // h_t whole in every block before step t + 1 reads it (and h_{t-1} free to overwrite)
    }
}

// The launch: P and hs (T, B, 256), h0 (B, 256), wh's rows at stride wh_stride floats.
void launch_rnn_recurrence(const float* P, const float* h0, const float* wh, long long wh_stride, float* hs, int T,
                           int B, void* stream) {
    if (T <= 0 || B <= 0) return;
    mc_check(cudaFuncSetAttribute(rnn_recurrence, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(RS_SMEM)), "rnn_recurrence shared memory");
    rnn_recurrence<<<B * 4, 256, RS_SMEM, static_cast<cudaStream_t>(stream)>>>(P, h0, wh, wh_stride, hs, T, B);
    mc_check(cudaGetLastError(), "rnn_recurrence launch");
}

// `rows` rows of `width` floats from src (rows at src_stride floats) to dst (rows packed), by the copy engine.
void launch_copy_rows(float* dst, const float* src, long long rows, long long width, long long src_stride,
                      void* stream) {
    mc_check(cudaMemcpy2DAsync(dst, width * sizeof(float), src, src_stride * sizeof(float), width * sizeof(float),
                               rows, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)), "copy_rows");
}
