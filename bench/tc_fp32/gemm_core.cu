// 3xTF32 GEMM core on Hopper wgmma (sm_90a): C[M,N] = epilogue(A[M,K] . op(B)), FP32-accurate.
// Source of truth for every bench/kernelbench_solutions/fp32_tc solution: bench/tc_fp32_sync.py
// copies this file into each one, with the problem's epilogue at the marker below.
//
// A is M x K row-major. B is N x K row-major (B_KN 0: a Linear layer's weight, or B.T) or K x N
// row-major (B_KN 1: transposed while staged, since tf32 wgmma reads both operands K-major).
// CTA tile 128 x 128 x BK, 384 threads: warpgroup 0 produces, warpgroups 1 and 2 consume.
// The producer loads float4s from global memory, splits each value into hi = tf32(x) and
// lo = tf32(x - hi), and stores both into a STAGES-deep shared ring (per stage: A_hi, A_lo, B_hi,
// B_lo), guarded by mbarriers (full: producer -> consumers, empty: consumers -> producer).
// Each consumer computes 64 x 128 of the tile with wgmma m64n128k8 .tf32: per k8 step lo*hi' and
// hi*lo', then hi*hi' (lo*lo' is below float32's rounding).
//
// Shared layout (no swizzle), as verified on the GPU at 64 x 64: element (r, k) of a 128 x BK
// tile lies at ((r / 8) * (BK / 4) + k / 4) * 32 + (r % 8) * 4 + k % 4 floats: core matrices of
// 8 rows x 16 bytes, K-adjacent ones 128 bytes apart (LBO), 8-row groups BK * 32 bytes apart (SBO).
//
// Compile-time switches (a build may define them first):
//   STAGES       depth of the shared ring (BK 32: 2 or 3; BK 16: up to 6)
//   BK           K per stage, 16 or 32
//   HI_IMPLICIT  0: hi = cvt.rna.tf32(x); 1: hi = x as it is (the tensor core reads the top 19 bits)
//                and lo = tf32(x - (x with its low 13 bits cleared))
//   FRESH_D      1: each K stage accumulates into a fresh fragment (scale-d 0 on its first wgmma),
//                added to float32 registers with ordinary adds; 0: one accumulator over all of K,
//                one stage's wgmmas kept in flight
//   GROUP_M      tiles along M per raster group (L2 reuse of B tiles)
//   SWIZZLE      1: 128-byte swizzled tiles (BK 32: a tile row is one 128-byte line, its 16-byte
//                chunks permuted by XOR with row % 8, 8-row atoms of 1024 bytes) instead of
//                core-matrix-interleaved ones, so the tensor core's operand reads spread over the banks
//   PREFETCH     1: the producer loads the next K tile while it stores this one; 0: one at a time
#include <cuda_runtime.h>
#include <cstdint>
#include <stdexcept>
#include <string>

#ifndef BK
#define BK 32
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef HI_IMPLICIT
#define HI_IMPLICIT 0
#endif
#ifndef FRESH_D
#define FRESH_D 1
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef B_KN
#define B_KN 0
#endif
#ifndef SWIZZLE
#define SWIZZLE 0
#endif
#ifndef PREFETCH
#if B_KN
#define PREFETCH 0  // with the 4x4 transposes a second register set spills (and measured slower)
#else
#define PREFETCH 1
#endif
#endif

// What the epilogue may read besides the accumulator: a per-column bias, a second per-column
// vector and three scalars (which ones mean what is the problem's business).
struct EpiArgs {
    const float* bias;
    const float* add;
    float p0, p1, p2;
};

// The problems' elementwise functions, written as PyTorch's CUDA kernels compute them in float.
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu_erf(float x) { return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f)); }
__device__ __forceinline__ float mish_f(float x) { return x * tanhf(log1pf(expf(x))); }
__device__ __forceinline__ float clamp_f(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }

// @epilogue

namespace gemm3x {

constexpr int BM = 128, BN = 128, THREADS = 384;
constexpr int C4 = BK / 4;                         // 16-byte chunks per tile row
constexpr int TILE = 128 * BK;                     // floats in one 128 x BK operand tile
constexpr int STAGE_FLOATS = 4 * TILE;             // A_hi, A_lo, B_hi, B_lo
constexpr int NK_LOADS = TILE / 4 / 128;           // float4s per producer thread per K-major tile
constexpr int KN_BLOCKS = (BK / 4) * (BN / 4) / 128;  // 4x4 blocks per producer thread, K x N tile
// descriptor byte offsets (see the layout above; with SWIZZLE, LBO is unused and SBO is one 8-row atom)
constexpr uint32_t LBO = SWIZZLE ? 16 : 128, SBO = SWIZZLE ? 1024 : BK * 32;
// + 1024: the ring is aligned to 1024 bytes inside the dynamic window (the swizzle reads address bits)
constexpr size_t SMEM_BYTES = size_t(STAGES) * STAGE_FLOATS * sizeof(float) + 2 * STAGES * sizeof(uint64_t) + 1024;
static_assert(BK == 16 || BK == 32, "BK must be 16 or 32");
static_assert(!SWIZZLE || BK == 32, "the 128-byte swizzle needs BK 32 (one 128-byte line per tile row)");
static_assert(STAGES >= 2, "at least two stages");
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory over 227 KB: fewer STAGES or a smaller BK");
static_assert(NK_LOADS == 4 * KN_BLOCKS, "both B orientations stage the same number of float4s");

// ---------------------------------------------------------------------------------------------
// PTX wrappers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Shared-memory matrix descriptor: start address, leading (K) and stride (8-row group) byte
// offsets, each encoded as (x & 0x3FFFF) >> 4; swizzle mode 0 (none), base offset 0.
__device__ __forceinline__ uint64_t smem_desc(const float* p) {
    const uint64_t addr = smem_addr(p);
    // With SWIZZLE, layout type 1 (128-byte swizzle, bits 62-63): K-major, LBO unused (16), SBO one
    // 8-row atom of 1024 bytes; a k step inside the 128-byte row moves the start address only.
    return ((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((LBO & 0x3FFFF) >> 4) << 16) |
           (static_cast<uint64_t>((SBO & 0x3FFFF) >> 4) << 32) | (static_cast<uint64_t>(SWIZZLE) << 62);
}

// d (+)= A . B for one 64 x 128 x 8 block; scale_d 0 overwrites d instead of adding to it.
__device__ __forceinline__ void wgmma_m64n128k8(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of these registers across the asynchronous
// wgmma (they are written by the tensor core only once wgmma.wait_group returns).
__device__ __forceinline__ void fence_regs(float (&r)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Release: the caller's earlier shared stores are visible to whoever acquires the phase.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}

// Waits until the phase of parity `parity` has completed (acquire).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}

// Generic-proxy shared stores become visible to the async proxy (wgmma reads shared memory there).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ float tf32(float v) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return __uint_as_float(r);
}

// ---------------------------------------------------------------------------------------------
// Producer: global -> registers -> hi/lo split -> shared

__device__ __forceinline__ float4 ldg4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

// Stores v = hi + lo (+ a remainder near 2^-22 of v) at the same place of the hi and lo tiles.
__device__ __forceinline__ void split_store(float* hi, float* lo, int at, float4 v) {
#if HI_IMPLICIT
    const float4 h = make_float4(__uint_as_float(__float_as_uint(v.x) & 0xffffe000u),
                                 __uint_as_float(__float_as_uint(v.y) & 0xffffe000u),
                                 __uint_as_float(__float_as_uint(v.z) & 0xffffe000u),
                                 __uint_as_float(__float_as_uint(v.w) & 0xffffe000u));
    *reinterpret_cast<float4*>(hi + at) = v;
#else
    const float4 h = make_float4(tf32(v.x), tf32(v.y), tf32(v.z), tf32(v.w));
    *reinterpret_cast<float4*>(hi + at) = h;
#endif
    *reinterpret_cast<float4*>(lo + at) =
        make_float4(tf32(v.x - h.x), tf32(v.y - h.y), tf32(v.z - h.z), tf32(v.w - h.w));
}

// Float4 `it` of a producer thread in a 128-row K-major tile: lanes 8j..8j+7 take the 8 rows of
// one core matrix, so each quarter-warp's 16-byte stores fill one 128-byte line (no bank
// conflict); in global memory a warp reads 8 rows x 64 contiguous bytes.
__device__ __forceinline__ void nk_coords(int t, int it, int& r, int& c4) {
    const int idx = t + 128 * it;
    r = (idx & 7) + 8 * ((idx >> 3) / C4);
    c4 = (idx >> 3) % C4;
}

#if SWIZZLE
__device__ __forceinline__ int tile_at(int r, int c4) { return r * 32 + ((c4 ^ (r & 7)) << 2); }
constexpr int KSTEP = 8;   // floats from one k8 step to the next: 32 bytes along the row
#else
__device__ __forceinline__ int tile_at(int r, int c4) { return ((r >> 3) * C4 + c4) * 32 + (r & 7) * 4; }
constexpr int KSTEP = 64;  // two core matrices of 128 bytes
#endif

// A 128 x BK slice of a rows x K row-major matrix, rows from r0, K from k0; zeros outside.
__device__ __forceinline__ void load_nk(const float* src, int rows, int K, int r0, int k0, int t,
                                        float4 (&v)[NK_LOADS]) {
#pragma unroll
    for (int it = 0; it < NK_LOADS; ++it) {
        int r, c4;
        nk_coords(t, it, r, c4);
        const int row = r0 + r, k = k0 + 4 * c4;
        v[it] = (row < rows && k < K) ? ldg4(src + static_cast<size_t>(row) * K + k)
                                      : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

__device__ __forceinline__ void store_nk(float* hi, float* lo, int t, const float4 (&v)[NK_LOADS]) {
#pragma unroll
    for (int it = 0; it < NK_LOADS; ++it) {
        int r, c4;
        nk_coords(t, it, r, c4);
        split_store(hi, lo, tile_at(r, c4), v[it]);
    }
}

// K x N (B_KN): block `blk` of a producer thread is 4 K-rows x 4 columns; lane = column quad nq
// (a warp reads 512 contiguous bytes per row), warp and blk give the K quad kq.
__device__ __forceinline__ void kn_coords(int t, int blk, int& nq, int& kq) {
    const int b = t + 128 * blk;
    nq = b & 31;
    kq = b >> 5;
}

__device__ __forceinline__ void load_kn(const float* src, int N, int K, int n0, int k0, int t,
                                        float4 (&v)[NK_LOADS]) {
#pragma unroll
    for (int blk = 0; blk < KN_BLOCKS; ++blk) {
        int nq, kq;
        kn_coords(t, blk, nq, kq);
        const int n = n0 + 4 * nq;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int k = k0 + 4 * kq + j;
            v[4 * blk + j] =
                (n < N && k < K) ? ldg4(src + static_cast<size_t>(k) * N + n) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
}

__device__ __forceinline__ float4 pick4(float4 a, float4 b, float4 c, float4 d, int m) {
    const float4 lo = (m & 1) ? b : a;
    const float4 hi = (m & 1) ? d : c;
    return (m & 2) ? hi : lo;
}

// Transposes each 4 x 4 block in registers and stores its 4 columns as K-contiguous float4s.
// Lane nq starts at column (nq / 2) % 4 of its quad, so the 8 lanes of a quarter-warp store to 8
// different 16-byte bank groups.
__device__ __forceinline__ void store_kn(float* hi, float* lo, int t, const float4 (&v)[NK_LOADS]) {
#pragma unroll
    for (int blk = 0; blk < KN_BLOCKS; ++blk) {
        int nq, kq;
        kn_coords(t, blk, nq, kq);
        const float4 r0 = v[4 * blk], r1 = v[4 * blk + 1], r2 = v[4 * blk + 2], r3 = v[4 * blk + 3];
        const float4 c0 = make_float4(r0.x, r1.x, r2.x, r3.x), c1 = make_float4(r0.y, r1.y, r2.y, r3.y);
        const float4 c2 = make_float4(r0.z, r1.z, r2.z, r3.z), c3 = make_float4(r0.w, r1.w, r2.w, r3.w);
        const int rot = (nq >> 1) & 3;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int m = (j + rot) & 3;
            split_store(hi, lo, tile_at(4 * nq + m, kq), pick4(c0, c1, c2, c3, m));
        }
    }
}

// One K tile's operands from global memory into registers (zeros past K).
__device__ __forceinline__ void load_stage(const float* __restrict__ A, const float* __restrict__ B, int M, int N,
                                           int K, int m0, int n0, int kt, int t, float4 (&va)[NK_LOADS],
                                           float4 (&vb)[NK_LOADS]) {
    load_nk(A, M, K, m0, kt * BK, t, va);
#if B_KN
    load_kn(B, N, K, n0, kt * BK, t, vb);
#else
    load_nk(B, N, K, n0, kt * BK, t, vb);
#endif
}

// Registers -> stage kt % STAGES of the ring, once the consumers have freed it; then full[s].
__device__ __forceinline__ void store_stage(float* smem, uint32_t bars, int kt, int t, const float4 (&va)[NK_LOADS],
                                            const float4 (&vb)[NK_LOADS]) {
    const int s = kt % STAGES;
    mbar_wait(bars + 8 * (STAGES + s), ((kt / STAGES) & 1) ^ 1);  // stage s free again
    float* st = smem + s * STAGE_FLOATS;
    store_nk(st, st + TILE, t, va);
#if B_KN
    store_kn(st + 2 * TILE, st + 3 * TILE, t, vb);
#else
    store_nk(st + 2 * TILE, st + 3 * TILE, t, vb);
#endif
    fence_proxy_async();
    mbar_arrive(bars + 8 * s);
}

// With PREFETCH the loads of tile kt + 1 are in flight while tile kt is split and stored (two
// register sets, used alternately, so that no index into them is dynamic): the global-memory
// latency is paid once per tile pair at most, not once per tile.
__device__ __forceinline__ void produce(const float* __restrict__ A, const float* __restrict__ B, float* smem,
                                        uint32_t bars, int M, int N, int K, int m0, int n0, int ktiles, int t) {
#if PREFETCH
    float4 va0[NK_LOADS], vb0[NK_LOADS], va1[NK_LOADS], vb1[NK_LOADS];
    if (ktiles > 0) load_stage(A, B, M, N, K, m0, n0, 0, t, va0, vb0);
    for (int kt = 0; kt < ktiles; kt += 2) {
        if (kt + 1 < ktiles) load_stage(A, B, M, N, K, m0, n0, kt + 1, t, va1, vb1);
        store_stage(smem, bars, kt, t, va0, vb0);
        if (kt + 1 >= ktiles) break;
        if (kt + 2 < ktiles) load_stage(A, B, M, N, K, m0, n0, kt + 2, t, va0, vb0);
        store_stage(smem, bars, kt + 1, t, va1, vb1);
    }
#else
    float4 va[NK_LOADS], vb[NK_LOADS];
    for (int kt = 0; kt < ktiles; ++kt) {
        load_stage(A, B, M, N, K, m0, n0, kt, t, va, vb);  // issued before the wait: the loads fly while it waits
        store_stage(smem, bars, kt, t, va, vb);
    }
#endif
}

// ---------------------------------------------------------------------------------------------
// Consumers

// The 12 wgmmas of one stage for consumer cw (rows 64 cw .. 64 cw + 63 of the tile) into d.
__device__ __forceinline__ void stage_mma(float (&d)[64], const float* st, int cw, int first_scale) {
    const float* a_hi = st + cw * 64 * BK;
    const float* a_lo = st + TILE + cw * 64 * BK;
    const float* b_hi = st + 2 * TILE;
    const float* b_lo = st + 3 * TILE;
#pragma unroll
    for (int s = 0; s < BK / 8; ++s) {  // k = 8 per instruction: two core matrices along K
        wgmma_m64n128k8(d, smem_desc(a_lo + s * KSTEP), smem_desc(b_hi + s * KSTEP), s == 0 ? first_scale : 1);
        wgmma_m64n128k8(d, smem_desc(a_hi + s * KSTEP), smem_desc(b_lo + s * KSTEP), 1);
    }
#pragma unroll
    for (int s = 0; s < BK / 8; ++s) {
        wgmma_m64n128k8(d, smem_desc(a_hi + s * KSTEP), smem_desc(b_hi + s * KSTEP), 1);
    }
}

__device__ __forceinline__ void consume(const float* smem, uint32_t bars, int cw, int ktiles, float (&acc)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
#if FRESH_D
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % STAGES;
        mbar_wait(bars + 8 * s, (kt / STAGES) & 1);
        fence_regs(d);
        wgmma_fence();
        stage_mma(d, smem + s * STAGE_FLOATS, cw, 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(d);
        mbar_arrive(bars + 8 * (STAGES + s));  // this warpgroup is done reading stage s
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] += d[i];
    }
#else
    for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % STAGES;
        mbar_wait(bars + 8 * s, (kt / STAGES) & 1);
        fence_regs(acc);
        wgmma_fence();
        stage_mma(acc, smem + s * STAGE_FLOATS, cw, 1);
        wgmma_commit();
        wgmma_wait<1>();  // the previous stage's wgmmas are done: release its buffers
        fence_regs(acc);
        if (kt > 0) mbar_arrive(bars + 8 * (STAGES + (kt - 1) % STAGES));
    }
    wgmma_wait<0>();
    fence_regs(acc);
#endif
}

// Accumulator layout of m64nNk8: warp w of the warpgroup holds rows 16w..16w+15; register i of
// lane l is row l/4 (+8 when i % 4 >= 2), column 8 * (i / 4) + 2 * (l % 4) + i % 2.
__device__ __forceinline__ void store_tile(float* __restrict__ C, const float (&acc)[64], int M, int N, int m0,
                                           int n0, int cw, int t, const EpiArgs& e) {
    const int warp = t >> 5, lane = t & 31;
    const int rbase = m0 + 64 * cw + 16 * warp + (lane >> 2);
    const int cbase = n0 + 2 * (lane & 3);
    const bool pairs = (N & 1) == 0;
#pragma unroll
    for (int q = 0; q < 16; ++q) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = rbase + 8 * h, col = cbase + 8 * q;
            if (row >= M) continue;
            float* out = C + static_cast<size_t>(row) * N + col;
            if (pairs && col + 1 < N) {
                *reinterpret_cast<float2*>(out) = make_float2(epilogue(acc[4 * q + 2 * h], row, col, e),
                                                              epilogue(acc[4 * q + 2 * h + 1], row, col + 1, e));
            } else {
                if (col < N) out[0] = epilogue(acc[4 * q + 2 * h], row, col, e);
                if (col + 1 < N) out[1] = epilogue(acc[4 * q + 2 * h + 1], row, col + 1, e);
            }
        }
    }
}

// Grouped raster: GROUP_M tiles down M share the same B tiles while they are in L2.
__device__ __forceinline__ void tile_of(int bid, int tiles_m, int tiles_n, int& tm, int& tn) {
    const int per_group = GROUP_M * tiles_n;
    const int first = (bid / per_group) * GROUP_M;
    const int size = min(tiles_m - first, GROUP_M);
    const int r = bid % per_group;
    tm = first + r % size;
    tn = r / size;
}

__global__ void __launch_bounds__(THREADS, 1)
    gemm3x_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                  int K, EpiArgs e) {
    extern __shared__ __align__(128) float smem_raw[];
    // The ring starts at a 1024-byte boundary of the shared window (SMEM_BYTES holds the slack).
    float* const smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u) / 4;
    const uint32_t bars = smem_addr(smem + STAGES * STAGE_FLOATS);  // full[s] at +8s, empty[s] at +8(STAGES+s)
    const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
    int tm, tn;
    tile_of(blockIdx.x, (M + BM - 1) / BM, (N + BN - 1) / BN, tm, tn);
    const int m0 = tm * BM, n0 = tn * BN, ktiles = (K + BK - 1) / BK;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 128);                 // the producer warpgroup's threads
            mbar_init(bars + 8 * (STAGES + s), 256);      // both consumer warpgroups' threads
        }
    }
    __syncthreads();
    if (wg == 0) {
        produce(A, B, smem, bars, M, N, K, m0, n0, ktiles, t);
    } else {
        float acc[64];
        consume(smem, bars, wg - 1, ktiles, acc);
        store_tile(C, acc, M, N, m0, n0, wg - 1, t, e);
    }
}

}  // namespace gemm3x

void launch_gemm3x(const float* a, const float* b, float* c, int M, int N, int K, const float* bias,
                   const float* add, float p0, float p1, float p2, void* stream) {
    if (M <= 0 || N <= 0) return;
    using namespace gemm3x;
    cudaError_t err = cudaFuncSetAttribute(gemm3x_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(SMEM_BYTES));
    if (err != cudaSuccess) throw std::runtime_error(std::string("gemm3x smem attribute: ") + cudaGetErrorString(err));
    const long long tiles = static_cast<long long>((M + BM - 1) / BM) * ((N + BN - 1) / BN);
    const EpiArgs e{bias, add, p0, p1, p2};
    gemm3x_kernel<<<static_cast<unsigned>(tiles), THREADS, SMEM_BYTES, static_cast<cudaStream_t>(stream)>>>(
        a, b, c, M, N, K, e);
    err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(std::string("gemm3x launch: ") + cudaGetErrorString(err));
}
