"""Solution for level2/70_Gemm_Sigmoid_Scaling_ResidualAdd.py: Linear, then sigmoid(y) * scaling + y.

load_inline, C++ and CUDA apart: `forward` (cpp_sources, built with the torch/extension.h that
load_inline prepends) checks the tensors, allocates the output and calls a plain launcher in the CUDA
source, which includes no torch header (so nvcc compiles it in seconds; the C++ side is the cold
build's long part). The kernel computes each output of x @ W^T + b with FP32 FMAs (32 x 32 output
tiles, one output per thread, K walked 32 at a time through shared memory), then, before storing it:
sigmoid(y) * scaling + y.
Plain and obviously correct rather than fast: it is one of the ten solutions bench/eval_pipeline_bench.py
verifies, to measure how well their cold builds hide behind verifications.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
void launch_gemm_epilogue(const float* x, const float* w, const float* b, float* y,
                          float scaling, int M, int N, int K, void* stream);

torch::Tensor forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                      double scaling, int64_t stream) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 2, "x: a 2-D float32 CUDA tensor");
    TORCH_CHECK(weight.is_cuda() && weight.scalar_type() == torch::kFloat32 && weight.dim() == 2 &&
                weight.size(1) == x.size(1), "weight: float32 (out_features, in_features) on the GPU");
    TORCH_CHECK(bias.is_cuda() && bias.scalar_type() == torch::kFloat32 && bias.numel() == weight.size(0),
                "bias: float32 (out_features,) on the GPU");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int M = (int)x.size(0), K = (int)x.size(1), N = (int)weight.size(0);
    auto y = torch::empty({M, N}, x.options());
    if (M > 0 && N > 0) {
        launch_gemm_epilogue(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                             y.data_ptr<float>(), (float)scaling, M, N, K,
                             reinterpret_cast<void*>(stream));
    }
    return y;
}
"""

CUDA_SOURCE = r"""
#include <cuda_runtime.h>
#include <stdexcept>
#include <string>

constexpr int TILE = 32;

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

__global__ void gemm_epilogue(const float* __restrict__ x, const float* __restrict__ w,
                              const float* __restrict__ b, float* __restrict__ y,
                              float scaling, int M, int N, int K) {
    __shared__ float xs[TILE][TILE + 1];
    __shared__ float ws[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;   // output row: the batch index
    const int col = blockIdx.x * TILE + tx;   // output column: the feature index
    const int wrow = blockIdx.x * TILE + ty;  // the weight row this thread loads into the tile
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        const int k = k0 + tx;
        xs[ty][tx] = (row < M && k < K) ? x[(long long)row * K + k] : 0.0f;
        ws[ty][tx] = (wrow < N && k < K) ? w[(long long)wrow * K + k] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc = fmaf(xs[ty][kk], ws[tx][kk], acc);
        __syncthreads();
    }
    if (row < M && col < N) {
        float v = acc + b[col];
        v = sigmoid(v) * scaling + v;
        y[(long long)row * N + col] = v;
    }
}

void launch_gemm_epilogue(const float* x, const float* w, const float* b, float* y,
                          float scaling, int M, int N, int K, void* stream) {
    const dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    gemm_epilogue<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(x, w, b, y,
                                                                          scaling, M, N, K);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(std::string("gemm_epilogue launch: ") + cudaGetErrorString(err));
}
"""

_ext = load_inline(
    name="evalbench_70_gemm_sigmoid_scaling_residual",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["forward"],
    extra_cuda_cflags=["-O3", "-lineinfo"],
    verbose=False,
)


class ModelNew(nn.Module):
    """y = linear(x); sigmoid(y) * scaling_factor + y"""

    def __init__(self, input_size: int, hidden_size: int, scaling_factor: float) -> None:
        super().__init__()
        self.gemm = nn.Linear(input_size, hidden_size)
        self.scaling_factor = float(scaling_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        return _ext.forward(x, self.gemm.weight, self.gemm.bias, self.scaling_factor, stream)
