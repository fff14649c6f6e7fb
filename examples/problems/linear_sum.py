"""Linear layer, a sum over its outputs, then a scale (KernelBench level-2 format).

The sum over a linear layer's outputs has an exact rewrite: sum_j (x . W_j + b_j) = x . colsum(W) + sum(b),
the columns of W summed once per call instead of a (batch x in x out) GEMM. A candidate doing that is
legitimately far faster than the reference's roofline (its FLOPs at peak) suggests.

The sizes make the device work dominate both sides (H100 SXM, strict FP32 with TF32 off): the
reference's GEMM is 2.7e11 FLOPs, ~6 ms at cuBLAS's ~45 TFLOPS, while the rewrite reads W (64 MiB)
and x (128 MiB), ~0.06 ms at 3.35 TB/s. A rewrite called from Python (a few launches, ~0.1-0.4 ms
of host time per call) is then still 15x or more faster than eager; at a smaller batch the host
time of the call would hide most of its gain. Halved (the harness's second shape), the GEMM is 1/8
of that and the rewrite's reads 1/4.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    """y = scale * linear(x).sum(dim=1, keepdim=True)."""

    def __init__(self, in_features: int, out_features: int, scale: float) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        x = torch.sum(x, dim=1, keepdim=True)
        return x * self.scale


BATCH = 8192
IN_FEATURES = 4096
OUT_FEATURES = 4096
SCALE = 0.5


def get_inputs() -> list[torch.Tensor]:
    return [torch.rand(BATCH, IN_FEATURES)]


def get_init_inputs() -> list:
    return [IN_FEATURES, OUT_FEATURES, SCALE]
