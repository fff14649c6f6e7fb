"""Solution for level1/45_Average_Pooling_2D.py: 11x11 average pooling, stride 11, no padding (track fp32).

One thread per output element sums its 11 x 11 window row by row (a warp's 32 outputs read 352
contiguous floats per window row) and divides by 121, as AvgPool2d does without padding. The input
has 2^32 elements, so offsets are 64-bit and the sizes are passed apart (an NVRTC int argument is 32
bits).
"""

import functools

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void avg_pool_kernel(const float* __restrict__ x, float* __restrict__ y, int planes, int h,
                                           int w, int oh, int ow, int k, int s) {
    long long total = (long long)planes * oh * ow;
    long long stride = (long long)gridDim.x * blockDim.x;
    const float inv = 1.0f / (float)(k * k);
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        int c = (int)(idx % ow);
        long long rest = idx / ow;
        int r = (int)(rest % oh);
        long long plane = rest / oh;
        const float* src = x + plane * (long long)h * w + (long long)(r * s) * w + (long long)c * s;
        float acc = 0.0f;
        for (int i = 0; i < k; ++i) {
            const float* row = src + (long long)i * w;
            for (int j = 0; j < k; ++j) acc += row[j];
        }
        y[idx] = acc * inv;
    }
}
"""

THREADS = 256
MAX_BLOCKS = 132 * 32


@functools.cache
def _kernel():
    return torch.cuda._compile_kernel(KERNEL, "avg_pool_kernel")


class ModelNew(nn.Module):
    """AvgPool2d(kernel_size, stride=kernel_size when None, padding 0)."""

    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0) -> None:
        super().__init__()
        if padding != 0:
            raise ValueError("this kernel supports padding=0 only")
        self.k = int(kernel_size)
        self.s = int(stride) if stride is not None else self.k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        b, c, h, w = x.shape
        oh, ow = (h - self.k) // self.s + 1, (w - self.k) // self.s + 1
        y = torch.empty((b, c, oh, ow), device=x.device, dtype=x.dtype)
        total = b * c * oh * ow
        blocks = max(1, min(MAX_BLOCKS, (total + THREADS - 1) // THREADS))
        _kernel()(grid=(blocks, 1, 1), block=(THREADS, 1, 1), args=[x, y, b * c, h, w, oh, ow, self.k, self.s])
        return y
