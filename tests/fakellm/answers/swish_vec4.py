import torch
import torch.nn as nn

SWISH_SOURCE = r"""
__device__ __forceinline__ float swish(float v) { return v / (1.0f + expf(-v)); }

extern "C" __global__ void swish_vec4(const float* __restrict__ x, float* __restrict__ y, int n) {
    // Four elements per thread through 16-byte loads and stores, grid-stride; a scalar tail
    // handles sizes that are not a multiple of four.
    int n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x4[i];
        float4 r;
        r.x = swish(v.x);
        r.y = swish(v.y);
        r.z = swish(v.z);
        r.w = swish(v.w);
        y4[i] = r;
    }
    for (int i = n4 * 4 + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = swish(x[i]);
    }
}
"""

swish_vec4 = torch.cuda._compile_kernel(SWISH_SOURCE, "swish_vec4")


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n = x.numel()
        threads = 256
        blocks = min((n // 4 + threads - 1) // threads + 1, 132 * 16)
        swish_vec4(grid=(blocks, 1, 1), block=(threads, 1, 1), args=[x, y, n])
        return y
