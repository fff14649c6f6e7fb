import torch
import torch.nn as nn

SWISH_SOURCE = r"""
extern "C" __global__ void swish_vec4(const float4* __restrict__ x, float4* __restrict__ y, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        float4 r;
        r.x = v.x / (1.0f + expf(-v.x));
        r.y = v.y / (1.0f + expf(-v.y));
        r.z = v.z / (1.0f + expf(-v.z));
        r.w = v.w / (1.0f + expf(-v.w))
        y[i] = r;
    }
}
"""

swish_vec4 = torch.cuda._compile_kernel(SWISH_SOURCE, "swish_vec4")


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n4 = x.numel() // 4
        threads = 256
        swish_vec4(grid=((n4 + threads - 1) // threads, 1, 1), block=(threads, 1, 1), args=[x, y, n4])
        return y
