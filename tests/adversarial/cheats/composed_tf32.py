"""Exploit: switch TF32 on for every float32 matmul (problem: problems/tiny_block, mode composed).

The block's linear layers are the reference's own ops, which composed mode keeps; TF32 would make them
(and the reference's) several times faster in lower precision.
Caught by: the global settings captured before import and compared after (`tf32_switch`), and the
static check (`precision_lowered`).
"""

import math

import torch
import torch.nn as nn

KERNEL = r"""
extern "C" __global__ void gelu(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}
"""
torch.backends.cuda.matmul.allow_tf32 = True


class ModelNew(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        self.kernel = torch.cuda._compile_kernel(KERNEL, "gelu")

    def gelu(self, h: torch.Tensor) -> torch.Tensor:
        """GELU (erf form) in the candidate's own kernel."""
        h = h.contiguous()
        y = torch.empty_like(h)
        n = h.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[h, y, n])
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads)), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.out(self.gelu(self.fc(self.norm2(x))))
