import torch
import torch.nn as nn

SWISH_SOURCE = r"""
extern "C" __global__ void swish_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v / (1.0f + expf(-v));
    }
}
"""

swish_kernel = torch.cuda._compile_kernel(SWISH_SOURCE, "swish_kernel")


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n = x.numel()
        threads = 512
        swish_kernel(grid=((n + threads - 1) // threads, 1, 1), block=(threads, 1, 1), args=[x, y, n])
        return y
