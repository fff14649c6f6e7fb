"""The device's memory in use, sampled from the server (`harness.gpu.gpu_memory`)."""

from __future__ import annotations

import pytest

from kb_mcp.harness.gpu.gpu_memory import DeviceMemory


def test_without_a_device_nvml_knows_the_figures_stay_unknown_and_nothing_raises() -> None:
    with DeviceMemory("GPU-00000000-0000-0000-0000-000000000000") as sampled:
        pass
    assert sampled.idle is None and sampled.peak is None
    assert not DeviceMemory.available("") and not DeviceMemory.available("GPU-not-a-device")


def test_the_peak_is_the_largest_sample() -> None:
    sampled = DeviceMemory("")
    for used in (10, 30, None, 20):
        sampled._note(used)
    assert sampled.peak == 30


@pytest.mark.gpu
def test_on_a_gpu_the_sampler_sees_memory_another_process_takes() -> None:
    import subprocess
    import sys

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    assert DeviceMemory.available(uuid)
    take = ("import torch,time; x=torch.empty(4<<30, dtype=torch.uint8, device='cuda'); "
            "torch.cuda.synchronize(); time.sleep(2)")
    with DeviceMemory(uuid) as sampled:
        subprocess.run([sys.executable, "-c", take], check=True, timeout=120)
    assert sampled.idle is not None and sampled.peak is not None
    assert sampled.peak - sampled.idle >= 4 << 30
