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
// Compile-time switches (a build may define them first). The defaults: AREG 1, HI_IMPLICIT 1, and TMA
// with its 4-stage ring where B is N x K; where B is K x N, the producer stages both through registers
// (PREFETCH 0, 3 stages).
//   STAGES       depth of the shared ring (BK 32: 2 or 3; BK 16: up to 6; AREG: 4 and 8)
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
//   AREG         1: A from registers (below); 0: both operands from shared memory
//   REGS_PRODUCER, REGS_CONSUMER  with AREG, the per-thread registers the producer warpgroup keeps
//                and each consumer warpgroup takes (setmaxnreg); P + 2 C <= 3 x the 168 of launch
//   TMA          1: the raw tiles arrive by the Tensor Memory Accelerator (below); needs AREG 1,
//                HI_IMPLICIT 1, SWIZZLE 1, B_KN 0; BK 32 or 64 (64: two 128 x 32 sub-tiles per operand)
//
// TMA: with AREG the kernel was still bound by its producer (Nsight Compute on 1024 x 8192 x 8192:
// consumers waiting for full stages 35 % of their samples, the producer waiting for its global loads
// 47 % of its own, L1/TEX 98 %): 128 threads staging 32 KB a stage through registers expose the load
// latency. With TMA one thread of the producer's first warp issues each stage's two tile copies
// (128-byte swizzled, zeros past the matrix edges) as soon as the consumers free the slot, STAGES
// ahead; the other three warps only compute B_lo = tf32(B - B with its low 13 bits cleared) from the
// raw B tile into a tile of the same layout (a float4 at the same offset) once the copy has landed.
// B_hi is the raw tile itself (HI_IMPLICIT: the tensor core reads the top 19 bits), A is split by
// the consumers as with AREG, from the swizzled tile (chunk c of row r at chunk c ^ (r % 8)).
//
// AREG: the limit of the shared-operand design is the volume of shared-memory traffic, not bank
// conflicts (Nsight Compute, 1024 x 8192 x 8192: L1/TEX 97%, tensor pipe 38%, stalls on the L1TEX
// scoreboard; the 128-byte swizzle changed nothing). Per 128 x 128 x 32 stage the producer stores
// A_hi, A_lo, B_hi, B_lo (64 KB) and each consumer's 12 wgmmas read A (2 KB each, 24 KB) and B
// (4 KB each, 48 KB): 208 KB. With AREG the producer stores A once, unsplit (16 KB, in the
// core-matrix layout whatever SWIZZLE says), each consumer loads its 64 x BK slice with ldmatrix
// (8 KB, conflict-free: one 8-row core matrix is one 128-byte line) and splits it in registers
// (cvt.rna.tf32, lo = tf32(x - hi), as the producer splits B); only B is read by the
// tensor core from shared memory: 48 + 16 + 96 = 160 KB a stage, and a stage takes 48 KB of shared
// memory instead of 64 (STAGES 4 fits). The A fragment of wgmma m64nNk8 .tf32 (PTX ISA, "Register
// Fragments", figure "WGMMA .m64nNk8 register fragment layout for matrix A"): warp w of the
// warpgroup holds rows 16w..16w+15; lane l, g = l / 4, t = l % 4, holds a0 (row g, k t),
// a1 (row g + 8, k t), a2 (row g, k t + 4), a3 (row g + 8, k t + 4), as mma.m16n8k8's .tf32 A.
// ldmatrix .m8n8.x4 .b16 gives lane l of matrix j the 32-bit word (row l / 4, word l % 4): with
// matrices j = 0..3 at (rows +0, k +0), (rows +8, k +0), (rows +0, k +4), (rows +8, k +4) it
// returns {a0, a1, a2, a3} as they are. The fragments (hi and lo of a stage's BK / 8 k steps)
// stay in registers until wgmma.wait_group: acc 64 + fresh d 64 + A 8 BK / 8 (32 at BK 32) = 160
// plus addresses and counters, against the 168 a thread gets at launch (384 threads). nvcc 13
// fits a consumer in 168 without spills once setmaxnreg marks the warpgroups' parts (without the
// instructions, 12 bytes spill), and the producer with PREFETCH needs 160 or more: 168 each, the
// instructions as no-ops; without PREFETCH the producer keeps 104 and the consumers take 200.
// AREG needs FRESH_D 1 (with one stage's wgmmas in flight, the next stage's fragments would need a
// second register set).
#include <cuda_runtime.h>
#include <cstdint>
#ifndef B_KN
#define B_KN 0
#endif
#ifndef TMA
#define TMA (B_KN ? 0 : 1)  // the copies cannot transpose a K x N B into the K-major tiles tf32 needs
#endif
#if TMA
#include <cuda.h>          // CUtensorMap and its enums (types only: the encoder is fetched from the driver at run time)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#endif
#include <stdexcept>
#include <string>

#ifndef BK
#define BK 32
#endif
#if TMA && !defined(SWIZZLE)
#define SWIZZLE 1
#endif
#ifndef STAGES
#if TMA
#define STAGES (BK == 64 ? 2 : 4)
#else
#define STAGES 3
#endif
#endif
#ifndef HI_IMPLICIT
#define HI_IMPLICIT 1
#endif
#ifndef FRESH_D
#define FRESH_D 1
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef SWIZZLE
#define SWIZZLE 0
#endif
#ifndef AREG
#define AREG 1
#endif
#ifndef PREFETCH
#if B_KN
#define PREFETCH 0  // with the 4x4 transposes a second register set spills (and measured slower)
#else
#define PREFETCH 1
#endif
#endif
// With AREG (nvcc 13, sm_90a, no spills): the producer needs 160 to 168 registers with PREFETCH (two
// register sets of 16 float4s; 152 spills) and 104 without; a consumer fits in 168. With PREFETCH
// 168 for both (the setmaxnreg instructions then change nothing but still help ptxas: see above).
#ifndef REGS_PRODUCER
#if TMA
#define REGS_PRODUCER 56  // one thread issues copies, the others split B: few registers
#elif PREFETCH
#define REGS_PRODUCER 168
#else
#define REGS_PRODUCER 104
#endif
#endif
#ifndef REGS_CONSUMER
#define REGS_CONSUMER ((504 - REGS_PRODUCER) / 2 / 8 * 8 < 256 ? (504 - REGS_PRODUCER) / 2 / 8 * 8 : 256)
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
constexpr int A_TILES = AREG ? 1 : 2;              // A (split by the consumers), or A_hi and A_lo
constexpr int STAGE_FLOATS = (A_TILES + 2) * TILE; // the A tile(s), B_hi, B_lo
constexpr int B_OFF = A_TILES * TILE;              // B_hi's offset in a stage; B_lo follows it
constexpr int NK_LOADS = TILE / 4 / 128;           // float4s per producer thread per K-major tile
constexpr int KN_BLOCKS = (BK / 4) * (BN / 4) / 128;  // 4x4 blocks per producer thread, K x N tile
// descriptor byte offsets (see the layout above; with SWIZZLE, LBO is unused and SBO is one 8-row atom)
constexpr uint32_t LBO = SWIZZLE ? 16 : 128, SBO = SWIZZLE ? 1024 : BK * 32;
// + 1024: the ring is aligned to 1024 bytes inside the dynamic window (the swizzle reads address bits)
// full[s], empty[s] and, with TMA, loaded[s] (the copies landed): 8 bytes each
constexpr int BARRIERS = TMA ? 3 : 2;
constexpr size_t SMEM_BYTES =
    size_t(STAGES) * STAGE_FLOATS * sizeof(float) + BARRIERS * STAGES * sizeof(uint64_t) + 1024;
static_assert(BK == 16 || BK == 32 || (TMA && BK == 64), "BK must be 16 or 32 (64 with TMA)");
static_assert(!SWIZZLE || BK == 32 || TMA, "the 128-byte swizzle needs BK 32 (one 128-byte line per tile row)");
static_assert(!TMA || (AREG && HI_IMPLICIT && SWIZZLE && !B_KN),
              "TMA needs AREG 1, HI_IMPLICIT 1 (B_hi is the raw tile), SWIZZLE 1 (the copies' layout) and B_KN 0");
#if TMA
constexpr int SUB = 128 * 32;                      // floats in one 128 x 32 swizzled sub-tile (BK 64: two)
constexpr int SPLITTERS = 96;                      // the producer's warps 1-3 compute B_lo
#endif
static_assert(STAGES >= 2, "at least two stages");
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory over 227 KB: fewer STAGES or a smaller BK");
static_assert(NK_LOADS == 4 * KN_BLOCKS, "both B orientations stage the same number of float4s");
static_assert(!AREG || FRESH_D, "AREG keeps one stage's A fragments in registers: FRESH_D 1 only");
static_assert(!AREG || (REGS_PRODUCER % 8 == 0 && REGS_CONSUMER % 8 == 0 && REGS_PRODUCER >= 24 &&
                        REGS_PRODUCER <= 168 && REGS_CONSUMER >= 168 && REGS_CONSUMER <= 256 &&
                        REGS_PRODUCER + 2 * REGS_CONSUMER <= 504),
              "setmaxnreg: multiples of 8 in 24..256, the producer at most and the consumers at least the "
              "168 of launch, within the CTA's 384 x 168 registers");

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

#if AREG
// The same with A from registers (the m64nNk8 .tf32 A fragment: four .b32 registers, see the
// header); .tf32 takes no transpose arguments in either form.
__device__ __forceinline__ void wgmma_m64n128k8_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// Four 8 x 16-byte matrices from shared memory (lanes 8j..8j+7 give the row addresses of matrix j);
// lane l receives the 32-bit word (row l / 4, word l % 4) of matrix j in r[j]. Volatile: it stays
// after the mbarrier wait that makes the stage readable.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// Register reconfiguration of the whole warpgroup (all its warps execute it).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
#endif

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

#if AREG
// The same for A fragments read by wgmmas in flight (valid until wgmma.wait_group says they are done).
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
    }
}
#endif

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

#if TMA
// One arrival that also announces `bytes` of asynchronous copies completing on the same phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// A box of the tensor map at (inner c0, outer c1) into shared memory; the bytes complete on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
#endif

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

#if AREG
// The core-matrix-interleaved layout (the header's); with AREG the A tile always has it, whatever
// SWIZZLE says: only ldmatrix reads it, one 128-byte core matrix per 8 lanes, conflict-free.
__device__ __forceinline__ int tile_at_cm(int r, int c4) { return ((r >> 3) * C4 + c4) * 32 + (r & 7) * 4; }
#if !TMA
constexpr int KSTEP_CM = 64;  // two core matrices of 128 bytes
#endif
#endif

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

#if AREG
// A unsplit: the consumers split it as they load their fragments. The 16-byte store is spelled out:
// written as a float4 assignment, nvcc 13 made four 4-byte stores of it for B_KN 1 and for SWIZZLE
// (four times the store instructions, and 4-way bank conflicts in this lane order).
__device__ __forceinline__ void store_nk_raw(float* dst, int t, const float4 (&v)[NK_LOADS]) {
#pragma unroll
    for (int it = 0; it < NK_LOADS; ++it) {
        int r, c4;
        nk_coords(t, it, r, c4);
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(dst + tile_at_cm(r, c4))),
                     "f"(v[it].x), "f"(v[it].y), "f"(v[it].z), "f"(v[it].w)
                     : "memory");
    }
}
#endif

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
#if AREG
    store_nk_raw(st, t, va);
#else
    store_nk(st, st + TILE, t, va);
#endif
#if B_KN
    store_kn(st + B_OFF, st + B_OFF + TILE, t, vb);
#else
    store_nk(st + B_OFF, st + B_OFF + TILE, t, vb);
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

#if TMA
// lo = tf32(x - x with its low 13 bits cleared), as split_store computes it with HI_IMPLICIT.
__device__ __forceinline__ float4 lo_of(float4 v) {
    const float4 h = make_float4(__uint_as_float(__float_as_uint(v.x) & 0xffffe000u),
                                 __uint_as_float(__float_as_uint(v.y) & 0xffffe000u),
                                 __uint_as_float(__float_as_uint(v.z) & 0xffffe000u),
                                 __uint_as_float(__float_as_uint(v.w) & 0xffffe000u));
    return make_float4(tf32(v.x - h.x), tf32(v.y - h.y), tf32(v.z - h.z), tf32(v.w - h.w));
}

// The producer warpgroup with TMA: thread 0 issues the copies (a slot as soon as the consumers
// free it), warps 1-3 write each stage's B_lo once its copies have landed, then mark it full.
__device__ __forceinline__ void produce_tma(const CUtensorMap* map_a, const CUtensorMap* map_b, float* smem,
                                            uint32_t bars, int m0, int n0, int ktiles, int t) {
    const uint32_t full = bars, empty = bars + 8 * STAGES, loaded = bars + 16 * STAGES;
    if (t == 0) {
        for (int kt = 0; kt < ktiles; ++kt) {
            const int s = kt % STAGES;
            mbar_wait(empty + 8 * s, ((kt / STAGES) & 1) ^ 1);  // stage s free again
            const uint32_t st = smem_addr(smem + s * STAGE_FLOATS);
            mbar_arrive_expect_tx(loaded + 8 * s, 2 * TILE * sizeof(float));
#pragma unroll
            for (int q = 0; q < BK / 32; ++q) {
                tma_load_2d(st + 4u * q * SUB, map_a, kt * BK + 32 * q, m0, loaded + 8 * s);
                tma_load_2d(st + 4u * (B_OFF + q * SUB), map_b, kt * BK + 32 * q, n0, loaded + 8 * s);
            }
        }
    } else if (t >= 32) {
        const int u = t - 32;
        for (int kt = 0; kt < ktiles; ++kt) {
            const int s = kt % STAGES;
            mbar_wait(loaded + 8 * s, (kt / STAGES) & 1);
            const float4* raw = reinterpret_cast<const float4*>(smem + s * STAGE_FLOATS + B_OFF);
            float4* lo = reinterpret_cast<float4*>(smem + s * STAGE_FLOATS + B_OFF + TILE);
#pragma unroll 4
            for (int i = u; i < TILE / 4; i += SPLITTERS) lo[i] = lo_of(raw[i]);
            fence_proxy_async();
            mbar_arrive(full + 8 * s);
        }
    }
}
#endif

// ---------------------------------------------------------------------------------------------
// Consumers

// The 12 wgmmas of one stage for consumer cw (rows 64 cw .. 64 cw + 63 of the tile) into d.
__device__ __forceinline__ void stage_mma(float (&d)[64], const float* st, int cw, int first_scale) {
    const float* a_hi = st + cw * 64 * BK;
    const float* a_lo = st + TILE + cw * 64 * BK;
    const float* b_hi = st + B_OFF;
    const float* b_lo = st + B_OFF + TILE;
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

#if AREG
constexpr int KSTEPS = BK / 8;

#if !TMA
// This lane's ldmatrix row address (bytes) in the A tile of k step 0: lane l gives row l % 8 of
// matrix j = l / 8, i.e. tile row 64 cw + 16 warp + l % 8 + 8 (j % 2), 16-byte chunk j / 2; k step
// s is KSTEP_CM floats further.
__device__ __forceinline__ uint32_t a_frag_offset(int cw, int t) {
    const int lane = t & 31, j = lane >> 3;
    const int row = 64 * cw + 16 * (t >> 5) + (lane & 7) + 8 * (j & 1);
    return 4u * static_cast<uint32_t>(tile_at_cm(row, j >> 1));
}
#endif

#if TMA
// With TMA the A tile is swizzled: this lane's row start (bytes) in sub-tile 0, and x = its 16-byte
// chunk of k step 0 XOR row % 8; k step s reads chunk x ^ 2 (s % 4) of sub-tile s / 4 (2 (s % 4) is
// even and the lane's chunk is 0 or 1, so XOR and addition agree). The 8 lanes of one matrix have 8
// different row % 8, hence 8 different chunks: no bank conflict.
__device__ __forceinline__ uint32_t a_frag_offset(int cw, int t) {
    const int lane = t & 31, j = lane >> 3;
    const int row = 64 * cw + 16 * (t >> 5) + (lane & 7) + 8 * (j & 1);
    return 128u * static_cast<uint32_t>(row);
}
__device__ __forceinline__ uint32_t a_frag_chunk(int t) { return static_cast<uint32_t>(((t & 31) >> 4) ^ (t & 7)); }
__device__ __forceinline__ uint32_t a_step_addr(uint32_t a, uint32_t x, int s) {
    return a + 4u * SUB * (s / 4) + ((x ^ (2u * (s % 4))) << 4);
}
#else
__device__ __forceinline__ uint32_t a_frag_chunk(int) { return 0; }
__device__ __forceinline__ uint32_t a_step_addr(uint32_t a, uint32_t, int s) { return a + 4u * KSTEP_CM * s; }
#endif

// A's fragments of one stage (`a`: this lane's address of k step 0, `x` its chunk with TMA), split:
// x = hi + lo (+ a remainder near 2^-22 of x), as split_store splits.
__device__ __forceinline__ void load_split_a(uint32_t a, uint32_t x, uint32_t (&hi)[KSTEPS][4],
                                             uint32_t (&lo)[KSTEPS][4]) {
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) ldsm_x4(a_step_addr(a, x, s), hi[s]);
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float x = __uint_as_float(hi[s][j]);
#if HI_IMPLICIT
            const float h = __uint_as_float(hi[s][j] & 0xffffe000u);  // hi[s][j] stays x itself
#else
            const float h = tf32(x);
            hi[s][j] = __float_as_uint(h);
#endif
            lo[s][j] = __float_as_uint(tf32(x - h));
        }
    }
}

// Floats from a B tile's start to k step s's (with TMA and BK 64: sub-tile s / 4, then the row).
#if TMA
__device__ __forceinline__ int b_step(int s) { return SUB * (s / 4) + KSTEP * (s % 4); }
#else
__device__ __forceinline__ int b_step(int s) { return KSTEP * s; }
#endif

// The wgmmas of one stage (3 per k step) with A from registers, in stage_mma's order.
__device__ __forceinline__ void stage_mma_rs(float (&d)[64], const float* st, const uint32_t (&hi)[KSTEPS][4],
                                             const uint32_t (&lo)[KSTEPS][4]) {
    const float* b_hi = st + B_OFF;
    const float* b_lo = st + B_OFF + TILE;
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
        wgmma_m64n128k8_rs(d, lo[s], smem_desc(b_hi + b_step(s)), s == 0 ? 0 : 1);
        wgmma_m64n128k8_rs(d, hi[s], smem_desc(b_lo + b_step(s)), 1);
    }
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
        wgmma_m64n128k8_rs(d, hi[s], smem_desc(b_hi + b_step(s)), 1);
    }
}

__device__ __forceinline__ void consume(const float* smem, uint32_t bars, int cw, int t, int ktiles,
                                        float (&acc)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    uint32_t hi[KSTEPS][4], lo[KSTEPS][4];
    const uint32_t a_lane = smem_addr(smem) + a_frag_offset(cw, t), a_chunk = a_frag_chunk(t);
    for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % STAGES;
        const float* st = smem + s * STAGE_FLOATS;
        mbar_wait(bars + 8 * s, (kt / STAGES) & 1);
        load_split_a(a_lane + 4u * STAGE_FLOATS * s, a_chunk, hi, lo);
        fence_regs(d);
        fence_regs(hi);  // written before the fence below, as wgmma.fence requires
        fence_regs(lo);
        wgmma_fence();
        stage_mma_rs(d, st, hi, lo);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(d);
        fence_regs(hi);  // read by the wgmmas until the wait: not reused before it
        fence_regs(lo);
        mbar_arrive(bars + 8 * (STAGES + s));  // this warpgroup is done reading stage s
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] += d[i];
    }
}
#else
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
#endif

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

#if TMA
#define GEMM3X_MAPS , const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b
#else
#define GEMM3X_MAPS
#endif

__global__ void __launch_bounds__(THREADS, 1)
    gemm3x_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                  int K, EpiArgs e GEMM3X_MAPS) {
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
#if TMA
            mbar_init(bars + 8 * s, SPLITTERS);              // the producer's splitting threads
#else
            mbar_init(bars + 8 * s, 128);                    // the producer warpgroup's threads
#endif
            mbar_init(bars + 8 * (STAGES + s), 256);         // both consumer warpgroups' threads
#if TMA
            mbar_init(bars + 8 * (2 * STAGES + s), 1);       // the copying thread (plus the copies' bytes)
#endif
        }
#if TMA
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
#endif
    }
    __syncthreads();
    if (wg == 0) {
#if AREG
        setmaxnreg_dec<REGS_PRODUCER>();
#endif
#if TMA
        (void)A;
        (void)B;
        produce_tma(&map_a, &map_b, smem, bars, m0, n0, ktiles, t);
#else
        produce(A, B, smem, bars, M, N, K, m0, n0, ktiles, t);
#endif
    } else {
        float acc[64];
#if AREG
        setmaxnreg_inc<REGS_CONSUMER>();
        consume(smem, bars, wg - 1, t, ktiles, acc);
#else
        consume(smem, bars, wg - 1, ktiles, acc);
#endif
        store_tile(C, acc, M, N, m0, n0, wg - 1, t, e);
    }
}

}  // namespace gemm3x

#if TMA
namespace gemm3x {
// cuTensorMapEncodeTiled from the driver the runtime uses (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (fn == nullptr) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult found;
        const cudaError_t err =
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
        if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr)
            throw std::runtime_error("gemm3x: the driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12 or later)");
        fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }
    return fn;
}

// A rows x K row-major matrix in 128 x 32 boxes, 128-byte swizzled, zeros past its edges.
CUtensorMap tile_map(const float* p, int rows, int K) {
    K = K > 0 ? K : 4;  // K 0: no K tile is ever copied, but the map must still be valid
    CUtensorMap map;
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(K) * sizeof(float)};
    const cuuint32_t box[2] = {32, 128}, unit[2] = {1, 1};
    const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(p), dims,
                                            strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        throw std::runtime_error("gemm3x: cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) +
                                 "): needs 16-byte aligned rows (K % 4 == 0) and a 16-byte aligned start");
    return map;
}
}  // namespace gemm3x
#endif

void launch_gemm3x(const float* a, const float* b, float* c, int M, int N, int K, const float* bias,
                   const float* add, float p0, float p1, float p2, void* stream) {
    if (M <= 0 || N <= 0) return;
    using namespace gemm3x;
    cudaError_t err = cudaFuncSetAttribute(gemm3x_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(SMEM_BYTES));
    if (err != cudaSuccess) throw std::runtime_error(std::string("gemm3x smem attribute: ") + cudaGetErrorString(err));
    const long long tiles = static_cast<long long>((M + BM - 1) / BM) * ((N + BN - 1) / BN);
    const EpiArgs e{bias, add, p0, p1, p2};
#if TMA
    gemm3x_kernel<<<static_cast<unsigned>(tiles), THREADS, SMEM_BYTES, static_cast<cudaStream_t>(stream)>>>(
        a, b, c, M, N, K, e, tile_map(a, M, K), tile_map(b, N, K));
#else
    gemm3x_kernel<<<static_cast<unsigned>(tiles), THREADS, SMEM_BYTES, static_cast<cudaStream_t>(stream)>>>(
        a, b, c, M, N, K, e);
#endif
    err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(std::string("gemm3x launch: ") + cudaGetErrorString(err));
}
