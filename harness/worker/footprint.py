"""A problem's footprint, read on the meta device before anything of it runs on the GPU (worker side).

On the meta device tensors have shapes and dtypes but no storage: the problem's `get_init_inputs`,
`Model(...)`, `get_inputs()` and one forward run there in milliseconds and allocate nothing, so a
problem of 16 GB is sized without touching the GPU (`harness.gpu.memory.Footprint`). The FLOPs of that
forward are counted on the way (`torch.utils.flop_counter` works on shapes), for the roofline bound.

Not every forward has a meta implementation (data-dependent shapes, `.item()`, a custom op): then
the inputs and parameters are still sized there, the output and FLOPs are measured on the GPU by the
first check, and the footprint says so (`method="device"`). A problem whose own code fails even to
build its inputs on the meta device is sized on the GPU the same way; its own failures are judged
where they happen, on the GPU.

The eager peak (`Footprint.eager_peak_bytes`) comes from the first real reference run
(`PeakMeter`): what that forward allocated on top of the parameters and the inputs.
"""

from __future__ import annotations

from typing import Any

import torch

from kb_mcp.harness.gpu.memory import Footprint
from kb_mcp.harness.worker.values import leaves

__all__ = ["PeakMeter", "device_free", "dtype_name", "first_float", "measure", "nbytes", "request_peak",
           "start_request"]


def nbytes(items: Any) -> int:
    """Bytes of the tensors among `items` (a list, a tuple or one tensor; anything else counts 0)."""
    if isinstance(items, torch.Tensor):
        return items.numel() * items.element_size()
    if isinstance(items, (list, tuple)):
        return sum(nbytes(x) for x in items)
    return 0


def _floats(tensors: list[torch.Tensor]) -> list[str]:
    return sorted({dtype_name(t.dtype) for t in tensors if t.is_floating_point()})


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> `float32`."""
    return str(dtype).replace("torch.", "")


def first_float(tensors: list[torch.Tensor]) -> str:
    """The first floating dtype among `tensors` (float32 where there is none)."""
    return next((dtype_name(t.dtype) for t in tensors if t.is_floating_point()), "float32")


def measure(pmod: Any) -> Footprint:
    """The problem module's footprint on the meta device (see the module's docstring); never raises
    for the problem's own code: what could not be sized is left to the GPU and said in `note`."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.device("meta"):
            init = list(pmod.get_init_inputs())
            model = pmod.Model(*init)
            xs = list(pmod.get_inputs())
    except Exception as exc:  # noqa: BLE001 - the problem's code; its failures are judged on the GPU
        return Footprint(method="device", note=f"not sized on the meta device ({type(exc).__name__}: "
                                              f"{str(exc)[:160]}); sized on the GPU")
    state = list(model.parameters()) + list(model.buffers())
    params = nbytes(state)
    inputs = [x for x in xs if isinstance(x, torch.Tensor)]
    try:
        if any(x.device.type != "meta" for x in inputs):
            raise RuntimeError("get_inputs() made tensors off the meta device")
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            out = model(*xs)
        outputs = leaves(out) or []
    except Exception as exc:  # noqa: BLE001 - no meta implementation: the first check measures it
        return Footprint(input_bytes=nbytes(inputs), param_bytes=params, method="device",
                         dtypes=_floats(inputs + state), dtype=first_float(inputs),
                         note=f"forward not run on the meta device ({type(exc).__name__}: {str(exc)[:160]}); its "
                              "output and FLOPs are measured on the GPU")
    return Footprint(input_bytes=nbytes(inputs), output_bytes=nbytes(outputs), param_bytes=params,
                     flops=float(counter.get_total_flops()), dtypes=_floats(inputs + outputs + state),
                     dtype=first_float(inputs + outputs))


def device_free() -> tuple[int, int]:
    """(free, total) bytes of the current device, every process's use counted (the driver's view)."""
    free, total = torch.cuda.mem_get_info()
    return int(free), int(total)


class PeakMeter:
    """What a block allocates at most on top of what was allocated when it began (caching allocator).

    Resetting the allocator's peak loses the peak reserved so far: it is added to `carried` first,
    where the request's own peak (`request_peak`) finds it."""

    def __init__(self, carried: list[int]) -> None:
        self.extra = 0
        self.carried = carried

    def __enter__(self) -> PeakMeter:
        torch.cuda.synchronize()
        self.carried.append(torch.cuda.max_memory_reserved())
        self._before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc: object) -> None:
        torch.cuda.synchronize()
        self.extra = max(0, torch.cuda.max_memory_allocated() - self._before)


def request_peak(carried: list[int]) -> int:
    """The most the allocator reserved since the request began (`start_request`), resets included."""
    return max([torch.cuda.max_memory_reserved(), *carried])


def start_request(carried: list[int]) -> None:
    """A request begins: the cached blocks of the last go back to the driver, the peaks start afresh."""
    carried.clear()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
