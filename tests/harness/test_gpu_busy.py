"""The GPUs' own busy share (`harness.gpu.gpu_busy`): NVML's utilization, sampled while a block runs.

On CPU there is no NVML answer, and the figure says so (None, never a zero that reads as idle); on a
GPU an idle block reads idle and a block of back-to-back kernels reads busy.
"""

from __future__ import annotations

import time

import pytest

from kb_mcp.harness.gpu.gpu_busy import GpuBusy
from kb_mcp.harness.gpu.gpu_probe import no_gpu_reason


@pytest.mark.skipif(no_gpu_reason() is None, reason="a GPU is visible here")
def test_without_nvml_there_is_no_figure() -> None:
    with GpuBusy(interval_s=0.02) as busy:
        time.sleep(0.1)
    assert busy.by_device() == {} and busy.share() is None


@pytest.mark.gpu
def test_an_idle_gpu_reads_idle_and_a_busy_one_busy() -> None:
    import torch

    x = torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize()
    with GpuBusy() as idle:
        time.sleep(2.0)
    with GpuBusy() as busy:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            for _ in range(8):
                x = (x @ x).clamp_(-1, 1)
            torch.cuda.synchronize()
    idle_share, busy_share = idle.share(), busy.share()
    assert idle_share is not None and busy_share is not None
    assert idle_share < 0.1 and busy_share > 0.8, (idle.by_device(), busy.by_device())
