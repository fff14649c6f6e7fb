"""Candidate for examples/problems/elementwise_chain_deep.py, load_inline style.

All three passes of the 40-op chain in one kernel: each thread keeps its element in registers
through the 120 ops, so the forward is one pybind call that allocates the output and launches
once, where the reference pays for 120 separate ops.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

void launch_chain(const float* x, const float* y, float* out, int n, void* stream);

torch::Tensor chain(torch::Tensor x, torch::Tensor y, int64_t stream) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "chain: inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "chain: float32 only");
    TORCH_CHECK(x.numel() == y.numel(), "chain: inputs differ in size");
    x = x.contiguous();
    y = y.contiguous();
    auto out = torch::empty_like(x);
    launch_chain(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), (int)x.numel(),
                 reinterpret_cast<void*>(stream));
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("chain", &chain, "three passes of the 40-op elementwise chain in one kernel");
}
"""

CUDA_SOURCE = r"""
#include <cuda_runtime.h>
#include <stdexcept>
#include <string>

__device__ __forceinline__ float chain_pass(float xv, float yv) {
    float z = xv * 1.5f + 0.25f;
    z = tanhf(z);
    z = z * yv;
    z = z - 0.1f;
    z = 1.0f / (1.0f + expf(-z));
    z = z * z;
    z = z + fabsf(yv);
    z = sqrtf(z + 1.0f);
    z = log1pf(z);
    z = fminf(fmaxf(z, 0.0f), 2.0f);
    z = sinf(z * 3.0f);
    z = z * cosf(xv);
    z = expf(-z * z);
    z = z / (1.0f + fabsf(xv));
    float w = z * 2.0f - 1.0f;
    w = atanf(w);
    w = w + xv * yv;
    w = erff(w);
    w = w * rsqrtf(1.0f + yv * yv);
    w = fmaxf(w, z - 0.5f);
    w = fmaxf(w, 0.0f) + 0.01f * w;
    w = w * 0.5f + z;
    return w;
}

__global__ void chain_kernel(const float* __restrict__ x, const float* __restrict__ y,
                             float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    const float yv = y[i];
    for (int p = 0; p < 3; ++p) v = chain_pass(v, yv);  // PASSES in the problem
    out[i] = v;
}

void launch_chain(const float* x, const float* y, float* out, int n, void* stream) {
    chain_kernel<<<(n + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(x, y, out, n);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(std::string("chain launch: ") + cudaGetErrorString(err));
}
"""

_ext = load_inline(
    name="kbmcp_example_chain_deep",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    no_implicit_headers=True,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    """All three passes in one kernel, one pybind call."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _ext.chain(x, y, torch.cuda.current_stream(x.device).cuda_stream)
