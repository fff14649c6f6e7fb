"""Exploit: submit the reference itself under an allow-list (problem: gemm, `gemm` allowed).

The allow-list lets GEMM candidates call torch.matmul for the product, meant for fusing their own
kernels around it. This candidate calls torch.matmul and nothing else -- no kernel of its own --
and would be timed as "as fast as cuBLAS" against eager, or faster against a cold baseline.
Caught by: the kernel census: no kernel of the candidate's own ran (`no_custom_kernel`).
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)
