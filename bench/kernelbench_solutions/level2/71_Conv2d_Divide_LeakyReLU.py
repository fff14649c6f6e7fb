"""Solution for level2/71_Conv2d_Divide_LeakyReLU.py: the convolution, the division and the
LeakyReLU in one kernel (track fp32, no library call).

Eager PyTorch runs cuDNN's convolution (FP32, TF32 off in this track), then a division and a
LeakyReLU, each reading and writing the 128 x 64 x 126 x 126 output (520 MB). Here one direct
convolution kernel (8 input channels, 3x3: 72 multiply-adds per output) applies the bias, the
division and the LeakyReLU to each accumulator before its only store.
"""

import functools

import torch
import torch.nn as nn

KERNEL = r"""
// Direct 3x3 convolution (stride 1, no padding) of CIN = 8 input channels into COUT = 64 output
// channels, FP32 on the CUDA cores, with the per-channel affine epilogue out = f(acc * scale[oc] +
// shift[oc]) applied before the only store. One block per output row (n, oy), one thread per output
// column: each thread keeps its 8 x 3 x 3 input patch in registers and the weights sit in shared
// memory, transposed so one 16-byte broadcast read gives four output channels' weights for one
// patch element (four independent accumulators per step).
#define CIN 8
#define COUT 64
#define KS 3
#define PATCH (CIN * KS * KS)

// The per-channel scale and shift are built in each block's prologue from the raw parameters (they
// may change between calls, so nothing derived from them is kept):
// mode 0: (conv + b) / p0, then LeakyReLU with slope p1 (bn_* unused);
// mode 1: BatchNorm in inference form on (conv + b), then * p0 (p1 = the BatchNorm's eps).
extern "C" __global__ void __launch_bounds__(128) conv3x3_affine(
    const float* __restrict__ x, const float* __restrict__ weight, const float* __restrict__ conv_bias,
    const float* __restrict__ bn_weight, const float* __restrict__ bn_bias, const float* __restrict__ bn_mean,
    const float* __restrict__ bn_var, float* __restrict__ out, int height, int width, int mode, double p0,
    double p1) {
    __shared__ __align__(16) float wt[PATCH][COUT];  // wt[i][oc] = weight[oc][i]
    __shared__ float sc[COUT], sh[COUT];
    for (int idx = threadIdx.x; idx < PATCH * COUT; idx += blockDim.x) {
        int oc = idx / PATCH, i = idx % PATCH;
        wt[i][oc] = weight[idx];
    }
    for (int oc = threadIdx.x; oc < COUT; oc += blockDim.x) {
        // the conv bias folded into the shift: (acc + b) * scale + shift = acc * scale + (b * scale + shift)
        float scale, shift;
        if (mode == 0) {
            scale = 1.0f / (float)p0;
            shift = 0.0f;
        } else {
            float g = bn_weight[oc] / sqrtf(bn_var[oc] + (float)p1);
            scale = g * (float)p0;
            shift = (bn_bias[oc] - bn_mean[oc] * g) * (float)p0;
        }
        sc[oc] = scale;
        sh[oc] = conv_bias[oc] * scale + shift;
    }
    __syncthreads();

    const int out_h = height - KS + 1, out_w = width - KS + 1;
    const int n = blockIdx.x / out_h, oy = blockIdx.x % out_h;
    const float slope = (float)p1;
    for (int ox = threadIdx.x; ox < out_w; ox += blockDim.x) {
        float patch[PATCH];
#pragma unroll
        for (int ci = 0; ci < CIN; ++ci)
#pragma unroll
            for (int ky = 0; ky < KS; ++ky)
#pragma unroll
                for (int kx = 0; kx < KS; ++kx)
                    patch[(ci * KS + ky) * KS + kx] =
                        x[(((size_t)n * CIN + ci) * height + oy + ky) * width + ox + kx];
        float* dst = out + (((size_t)n * COUT) * out_h + oy) * out_w + ox;
#pragma unroll 1
        for (int oc = 0; oc < COUT; oc += 4) {
            float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll
            for (int i = 0; i < PATCH; ++i) {
                float4 w4 = *reinterpret_cast<const float4*>(&wt[i][oc]);
                a0 = fmaf(patch[i], w4.x, a0);
                a1 = fmaf(patch[i], w4.y, a1);
                a2 = fmaf(patch[i], w4.z, a2);
                a3 = fmaf(patch[i], w4.w, a3);
            }
            float acc[4] = {a0, a1, a2, a3};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float v = acc[j] * sc[oc + j] + sh[oc + j];
                if (mode == 0) v = v > 0.0f ? v : v * slope;
                dst[(size_t)(oc + j) * out_h * out_w] = v;
            }
        }
    }
}
"""

CIN, COUT, KS = 8, 64, 3
THREADS = 128


@functools.cache
def _kernel():
    return torch.cuda._compile_kernel(KERNEL, "conv3x3_affine")


def _check_shapes(x: torch.Tensor, weight: torch.Tensor) -> None:
    # The kernel is specialised on the problem's channel counts and kernel size (compile-time
    # constants keep the patch in registers); other shapes are refused, not computed wrongly.
    if x.dim() != 4 or x.shape[1] != CIN or tuple(weight.shape) != (COUT, CIN, KS, KS):
        raise ValueError(f"conv3x3_affine is built for {CIN} -> {COUT} channels, 3x3; got x {tuple(x.shape)}, "
                         f"weight {tuple(weight.shape)}")


class ModelNew(nn.Module):
    """leaky_relu(conv2d(x) / divisor, 0.01)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, divisor: float) -> None:
        super().__init__()
        conv = nn.Conv2d(in_channels, out_channels, kernel_size)  # the reference's initialisation
        if conv.bias is None:
            raise ValueError("this solution is written for the problem's Conv2d with a bias")
        self.weight = conv.weight
        self.bias = conv.bias
        self.divisor = float(divisor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w, b = self.weight.contiguous(), self.bias.contiguous()
        _check_shapes(x, w)
        batch, _, height, width = x.shape
        out = torch.empty(batch, COUT, height - KS + 1, width - KS + 1, device=x.device, dtype=torch.float32)
        _kernel()(grid=(batch * (height - KS + 1), 1, 1), block=(THREADS, 1, 1),
                  args=[x, w, b, b, b, b, b, out, height, width, 0, self.divisor, 0.01])  # mode 0: BN unused
        return out
