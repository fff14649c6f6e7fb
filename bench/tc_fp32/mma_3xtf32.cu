// Float32 accuracy on the TF32 tensor cores ("3xTF32") with `mma.sync m16n8k8`, for the model kernels
// that use it (relu_attention.cu, vision_attention.cu; the renderer puts this file before them).
//
// Every operand value v is split into hi = tf32(v) and lo = tf32(v - hi); each 8-wide K chunk is
// lo*hi' + hi*lo' + hi*hi' accumulated afresh on the tensor core, then added to float32 registers with
// an ordinary add (the tensor core's own adder never sums more than one chunk).
//
// Fragments (PTX ISA, m16n8k8 .tf32), g = lane / 4, t = lane % 4: A a0 (g, t), a1 (g + 8, t), a2 (g, t + 4),
// a3 (g + 8, t + 4); B b0 (k t, n g), b1 (k t + 4, n g); C c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t),
// c3 (g + 8, 2t + 1).

#include <cuda_runtime.h>

__device__ __forceinline__ unsigned tc3_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void tc3_split(float v, unsigned& hi, unsigned& lo) {
    hi = tc3_tf32(v);
    lo = tc3_tf32(v - __uint_as_float(hi));
}

// d += a * b on one m16n8k8 TF32 tile.
__device__ __forceinline__ void tc3_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// acc += a * b at float32 accuracy: one chunk's three products, added to acc as float32.
__device__ __forceinline__ void tc3_mma3(float (&acc)[4], const unsigned (&a_hi)[4], const unsigned (&a_lo)[4],
                                         const unsigned (&b_hi)[2], const unsigned (&b_lo)[2]) {
    float chunk[4] = {0.f, 0.f, 0.f, 0.f};
    tc3_mma(chunk, a_lo, b_hi);
    tc3_mma(chunk, a_hi, b_lo);
    tc3_mma(chunk, a_hi, b_hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += chunk[i];
}

// The A fragment of an m16n8k8 product whose 16 x 8 tile is a C fragment (c) of this warp: a score
// tile used as the left operand of the next product, moved by shuffles (the owners of columns t and
// t + 4 of rows g and g + 8), split.
__device__ __forceinline__ void tc3_c_to_a(const float (&c)[4], unsigned (&hi)[4], unsigned (&lo)[4]) {
    const int lane = threadIdx.x % 32, t = lane % 4;
    const int src1 = (lane & ~3) | (t >> 1), src2 = src1 + 2;
    const bool odd = t & 1;
    const float x0 = __shfl_sync(0xffffffffu, c[0], src1), x1 = __shfl_sync(0xffffffffu, c[1], src1);
    const float x2 = __shfl_sync(0xffffffffu, c[2], src1), x3 = __shfl_sync(0xffffffffu, c[3], src1);
    const float z0 = __shfl_sync(0xffffffffu, c[0], src2), z1 = __shfl_sync(0xffffffffu, c[1], src2);
    const float z2 = __shfl_sync(0xffffffffu, c[2], src2), z3 = __shfl_sync(0xffffffffu, c[3], src2);
    tc3_split(odd ? x1 : x0, hi[0], lo[0]);  // (g, t)
    tc3_split(odd ? x3 : x2, hi[1], lo[1]);  // (g + 8, t)
    tc3_split(odd ? z1 : z0, hi[2], lo[2]);  // (g, t + 4)
    tc3_split(odd ? z3 : z2, hi[3], lo[3]);  // (g + 8, t + 4)
}
