"""Candidate for examples/problems/row_sum.py, load_inline style with light headers.

`no_implicit_headers=True` keeps load_inline from prepending torch/extension.h (the whole C++ API,
most of a cold build's time); the C++ file includes only torch/types.h and the pybind11 tensor
casters, and the .cu file no torch header at all: it exports a plain launcher, and the launch
stream comes from Python (`torch.cuda.current_stream()`). One block per row, 16-byte loads,
double accumulation, warp-shuffle reduction.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

// Defined in the .cu file, which includes no torch header at all (that keeps nvcc fast).
void launch_row_sum(const float* x, float* out, long long rows, int cols, void* stream);

torch::Tensor row_sum(torch::Tensor x, int64_t stream) {
    TORCH_CHECK(x.is_cuda(), "row_sum: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "row_sum: x must be float32");
    x = x.contiguous();
    const int64_t cols = x.size(-1);
    auto sizes = x.sizes().vec();
    sizes.back() = 1;
    auto out = torch::empty(sizes, x.options());
    launch_row_sum(x.data_ptr<float>(), out.data_ptr<float>(), x.numel() / cols, (int)cols,
                   reinterpret_cast<void*>(stream));
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("row_sum", &row_sum, "sum over the last dimension, keepdim");
}
"""

CUDA_SOURCE = r"""
#include <cuda_runtime.h>
#include <stdexcept>
#include <string>

constexpr int THREADS = 256;

__global__ void row_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    const float* row = x + (size_t)blockIdx.x * cols;
    double acc = 0.0;
    if ((cols & 3) == 0) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        for (int c = threadIdx.x; c < cols / 4; c += THREADS) {
            float4 v = row4[c];
            acc += (double)v.x + (double)v.y + (double)v.z + (double)v.w;
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += THREADS) acc += (double)row[c];
    }
    for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, offset);
    __shared__ double partial[THREADS / 32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < THREADS / 32 ? partial[lane] : 0.0;
        for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, offset);
        if (lane == 0) out[blockIdx.x] = (float)acc;
    }
}

void launch_row_sum(const float* x, float* out, long long rows, int cols, void* stream) {
    row_sum_kernel<<<(unsigned)rows, THREADS, 0, static_cast<cudaStream_t>(stream)>>>(x, out, cols);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(std::string("row_sum launch: ") + cudaGetErrorString(err));
}
"""

_ext = load_inline(
    name="kbmcp_example_row_sum",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    no_implicit_headers=True,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    """x.sum(dim=-1, keepdim=True) with one block per row."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.row_sum(x, torch.cuda.current_stream(x.device).cuda_stream)
