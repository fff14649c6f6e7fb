"""Each part's share of the model's GPU time: estimated from FLOPs and bytes (a roofline on a
reference device, plus a launch's cost), or measured from one profiled forward."""

from __future__ import annotations

from pydantic import BaseModel

from kb_mcp.decomposition.models import Part


class Device(BaseModel):
    """The peaks an estimate uses (an H200's fp32 and HBM figures by default)."""

    name: str = "H200 (fp32 CUDA cores, HBM3e)"
    flops_per_s: float = 67e12
    bytes_per_s: float = 4.8e12
    launch_us: float = 3.0  # one kernel's launch and tail, the floor of any part


REFERENCE_DEVICE = Device()


def estimate_us(flops: int, nbytes: int, device: Device = REFERENCE_DEVICE) -> float:
    """A part's time on `device` if it ran at the roofline: the slower of its compute and its traffic."""
    return device.launch_us + 1e6 * max(flops / device.flops_per_s, nbytes / device.bytes_per_s)


def rank_estimated(parts: list[Part], device: Device = REFERENCE_DEVICE) -> list[Part]:
    """The parts with their estimated times and shares (basis "estimated")."""
    timed = [p.model_copy(update={"estimated_us": round(estimate_us(p.flops, p.bytes, device), 3)}) for p in parts]
    total = sum(p.estimated_us for p in timed) or 1.0
    return [p.model_copy(update={"share": p.estimated_us / total, "share_basis": "estimated"}) for p in timed]


def rank_measured(parts: list[Part], measured_us: dict[str, float]) -> list[Part]:
    """The parts with the shares one profiled forward measured (by part name; basis "measured")."""
    total = sum(measured_us.get(p.name, 0.0) for p in parts) or 1.0
    return [p.model_copy(update={"share": measured_us.get(p.name, 0.0) / total, "share_basis": "measured"})
            for p in parts]
