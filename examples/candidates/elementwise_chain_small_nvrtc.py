"""Candidate for examples/problems/elementwise_chain_small.py, NVRTC style.

The reference runs 40 elementwise ops, one kernel each; on 8192 elements every one of them costs
a launch and little else. This kernel computes the whole chain per element in registers: one
launch, one read of each input, one write.
"""

import functools

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void chain(const float* __restrict__ x, const float* __restrict__ y,
                                 float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float xv = x[i];
    float yv = y[i];
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
    out[i] = w;
}
"""


@functools.cache
def _kernel():
    # NVRTC compiles in about 0.05 s; cached so every ModelNew shares one module.
    return torch.cuda._compile_kernel(KERNEL, "chain")


class ModelNew(nn.Module):
    """The whole chain in one kernel."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        threads = 256
        _kernel()(grid=((n + threads - 1) // threads, 1, 1), block=(threads, 1, 1), args=[x, y, out, n])
        return out
