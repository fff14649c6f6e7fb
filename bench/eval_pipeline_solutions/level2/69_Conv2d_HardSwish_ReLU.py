"""Solution for level2/69_Conv2d_HardSwish_ReLU.py: Conv2d, HardSwish, then ReLU.

load_inline, C++ and CUDA apart: `forward` (cpp_sources, built with the torch/extension.h that
load_inline prepends) checks the tensors, allocates the output and calls a plain launcher in the CUDA
source, which includes no torch header (so nvcc compiles it in seconds; the C++ side is the cold
build's long part). The kernel computes each output of the convolution directly (stride 1, no padding,
as nn.Conv2d(in, out, k) does: a sum over the input channels and the k x k window, FP32 FMAs), adds
the bias and, before storing it, applies HardSwish (x * min(max(x + 3, 0), 6) / 6) and the ReLU.
Plain and obviously correct rather than fast: it is one of the ten solutions bench/eval_pipeline_bench.py
verifies, to measure how well their cold builds hide behind verifications.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
void launch_conv2d_epilogue(const float* x, const float* w, const float* b, float* y, int N, int C, int H, int W,
                            int O, int KH, int KW, void* stream);

torch::Tensor forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, int64_t stream) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 4, "x: a 4-D float32 CUDA tensor");
    TORCH_CHECK(weight.is_cuda() && weight.scalar_type() == torch::kFloat32 && weight.dim() == 4 &&
                weight.size(1) == x.size(1), "weight: float32 (out_channels, in_channels, kh, kw) on the GPU");
    TORCH_CHECK(bias.is_cuda() && bias.scalar_type() == torch::kFloat32 && bias.numel() == weight.size(0),
                "bias: float32 (out_channels,) on the GPU");
    TORCH_CHECK(x.size(2) >= weight.size(2) && x.size(3) >= weight.size(3), "the input is smaller than the kernel");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int N = (int)x.size(0), C = (int)x.size(1), H = (int)x.size(2), W = (int)x.size(3);
    const int O = (int)weight.size(0), KH = (int)weight.size(2), KW = (int)weight.size(3);
    auto y = torch::empty({N, O, H - KH + 1, W - KW + 1}, x.options());
    if (y.numel() > 0) {
        launch_conv2d_epilogue(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                               y.data_ptr<float>(), N, C, H, W, O, KH, KW, reinterpret_cast<void*>(stream));
    }
    return y;
}
"""

CUDA_SOURCE = r"""
#include <cuda_runtime.h>
#include <stdexcept>
#include <string>

__global__ void conv2d_epilogue(const float* __restrict__ x, const float* __restrict__ w,
                                const float* __restrict__ b, float* __restrict__ y, int N, int C, int H,
                                int W, int O, int KH, int KW, int OH, int OW) {
    const long long total = (long long)N * O * OH * OW;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int ow = (int)(i % OW);
        long long t = i / OW;
        const int oh = (int)(t % OH);
        t /= OH;
        const int o = (int)(t % O);
        const int n = (int)(t / O);
        const float* xn = x + (long long)n * C * H * W;
        const float* wo = w + (long long)o * C * KH * KW;
        float acc = 0.0f;
        for (int c = 0; c < C; ++c) {
            for (int kh = 0; kh < KH; ++kh) {
                const float* xr = xn + ((long long)c * H + oh + kh) * W + ow;
                const float* wr = wo + (c * KH + kh) * KW;
                for (int kw = 0; kw < KW; ++kw) acc = fmaf(xr[kw], wr[kw], acc);
            }
        }
        float v = acc + b[o];
        v = v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) / 6.0f;
        v = v > 0.0f ? v : 0.0f;
        y[i] = v;
    }
}

void launch_conv2d_epilogue(const float* x, const float* w, const float* b, float* y, int N, int C, int H, int W,
                            int O, int KH, int KW, void* stream) {
    const int OH = H - KH + 1, OW = W - KW + 1;
    const long long total = (long long)N * O * OH * OW;
    const int threads = 256;
    const long long blocks = (total + threads - 1) / threads;
    const unsigned grid = (unsigned)(blocks < (1LL << 22) ? blocks : (1LL << 22));
    conv2d_epilogue<<<grid, threads, 0, static_cast<cudaStream_t>(stream)>>>(x, w, b, y, N, C, H, W, O, KH, KW, OH,
                                                                              OW);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(std::string("conv2d_epilogue launch: ") + cudaGetErrorString(err));
}
"""

_ext = load_inline(
    name="evalbench_69_conv2d_hardswish_relu",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    """relu(hardswish(conv(x)))"""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        return _ext.forward(x, self.conv.weight, self.conv.bias, stream)
