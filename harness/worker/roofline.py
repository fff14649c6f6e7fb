"""The roofline bound of a forward call (worker side): the least time its bytes need through DRAM,
or its FLOPs at the chip's peak, whichever is longer. A verdict reports it beside the timings
(`Timings.bound_ms`); the evidence for a result above the review threshold weighs against it.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PEAK_FLOPS", "dram_bandwidth", "peak_flops", "roofline_ms"]

# Peak dense throughput per dtype family (FLOP/s) used for the roofline bound: the fastest any
# unit of the chip can do that dtype (tensor cores included), from NVIDIA's H100/H200 SXM data
# sheets. Unknown GPUs get no compute bound.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H100": {"float64": 67e12, "float32": 495e12, "float16": 989e12, "bfloat16": 989e12, "float8": 1979e12},
    "H200": {"float64": 67e12, "float32": 495e12, "float16": 989e12, "bfloat16": 989e12, "float8": 1979e12},
}


def dram_bandwidth(props: Any) -> float | None:
    """Peak DRAM bytes/s from the device properties (memory clock x bus width x 2 for DDR)."""
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    if not clock_khz or not bus_bits:
        return None
    return clock_khz * 1e3 * 2 * bus_bits / 8


def peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    """The roofline compute peak for `dtype` on this GPU, or None when unknown."""
    family = next((k for k in PEAK_FLOPS if k in device_name), None)
    if family is None:
        return None
    name = str(dtype).replace("torch.", "")
    if name.startswith("float8"):
        name = "float8"
    return PEAK_FLOPS[family].get(name)


def roofline_ms(bytes_moved: int, flops: float, bandwidth: float | None, peak: float | None) -> float | None:
    """Lower bound on the time: moving `bytes_moved` through DRAM, or `flops` at peak, whichever is longer."""
    bounds = []
    if bandwidth:
        bounds.append(bytes_moved / bandwidth)
    if peak and flops:
        bounds.append(flops / peak)
    return max(bounds) * 1e3 if bounds else None
