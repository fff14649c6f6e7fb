import torch
import torch.nn as nn

SWISH_SOURCE = r"""
extern "C" __global__ void swish_chunks(const float* __restrict__ x, float* __restrict__ y, int n, int chunk) {
    // Each thread walks its own contiguous chunk: neighbouring threads touch addresses `chunk`
    // floats apart, so loads are not coalesced.
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int start = t * chunk;
    for (int k = 0; k < chunk; ++k) {
        int i = start + k;
        if (i < n) {
            float v = x[i];
            y[i] = v / (1.0f + expf(-v));
        }
    }
}
"""

swish_chunks = torch.cuda._compile_kernel(SWISH_SOURCE, "swish_chunks")


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n = x.numel()
        chunk = 16
        threads = 128
        per_block = threads * chunk
        swish_chunks(grid=((n + per_block - 1) // per_block, 1, 1), block=(threads, 1, 1), args=[x, y, n, chunk])
        return y
