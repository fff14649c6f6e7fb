"""Exploit: replay the whole block from a CUDA graph (problem: problems/tiny_block, mode composed).

The first call captures the reference's library ops with the candidate's GELU kernel in one graph;
every later call copies the input in (with its own kernel), replays the graph and copies the output
out: the library ops run without their launch costs, a speed-up that is not the candidate's kernel.
Caught by: the kernel census sees library kernels launched from a graph (`graph_replay`).
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
COPY = r"""
extern "C" __global__ void copy(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""


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

    def block(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads)), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.out(self.gelu(self.fc(self.norm2(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self, "_graph", None) is None or self._static_in.shape != x.shape:
            self._static_in = torch.empty_like(x)
            self.copy(x, self._static_in)
            self.block(self._static_in)  # warm-up: library handles and workspaces before the capture
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._static_out = self.block(self._static_in)
        self.copy(x, self._static_in)
        self._graph.replay()
        out = torch.empty_like(self._static_out)
        self.copy(self._static_out, out)
        return out

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """dst = src with the candidate's own kernel (GELU's, on the identity: one launch per element set)."""
        if not hasattr(self, "copier"):
            self.copier = torch.cuda._compile_kernel(COPY, "copy")
        n = src.numel()
        self.copier(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=[src.contiguous(), dst, n])
