import torch
import torch.nn as nn

CHAIN_SOURCE = r"""
extern "C" __global__ void chain_kernel(const float* __restrict__ x, const float* __restrict__ y,
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

chain_kernel = torch.cuda._compile_kernel(CHAIN_SOURCE, "chain_kernel")


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        threads = 128
        chain_kernel(grid=((n + threads - 1) // threads, 1, 1), block=(threads, 1, 1), args=[x, y, out, n])
        return out
