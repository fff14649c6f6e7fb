"""Exploit: cache results keyed on the input's address and shape (problem: swish).

A timing loop that calls forward on the same input tensor gets the cached output back without
any work after the first call. Addresses are recycled by the allocator, so even "fresh" inputs
often land at a cached address -- with different contents.
Caught by: rotating fresh inputs (with new values) in the checks and the timed runs, and
re-checking timed outputs (`result_caching`, `timed_output_mismatch`, `stateful_forward`).
"""

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void swish(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / (1.0f + expf(-x[i]));
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.cuda._compile_kernel(KERNEL, "swish")
        self.cache: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (x.data_ptr(), tuple(x.shape))
        if key not in self.cache:
            out = torch.empty_like(x)
            n = x.numel()
            self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, out, n])
            self.cache[key] = out
        return self.cache[key]
