"""How busy the GPUs actually were while a block ran: NVML's utilization, sampled (server side).

Holding the GPU lane is not using the GPU: a verification holding it may be copying to the host,
comparing there, or waiting for a worker. A bench that counts the lane as "GPU busy" counts all
that. The driver knows better: NVML's utilization (`nvmlDeviceGetUtilizationRates().gpu`) is the
percentage of its last sample period (1/6 s to 1 s, by product) in which one or more kernels ran on
the device. `GpuBusy` polls it for every device NVML lists from a thread while the block runs, and
the mean of the samples over 100 is the device's busy share of the block's wall time (its edges
blurred by one sample period). It counts kernels of every process on the device, not only ours,
and a kernel that keeps one SM busy counts as busy as one that fills them all: it says when the
GPU worked, not how much of it.

NVML comes from `nvidia-ml-py` (module `pynvml`), as in `harness.gpu.gpu_memory`. Where it is missing or
the driver refuses (no GPU, a MIG instance, which has no utilization of its own), the shares are
empty and the figure is None: nothing else depends on it.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

__all__ = ["GpuBusy"]

SAMPLE_S = 0.1  # NVML's own sample period is 1/6 s or longer: polling faster only repeats it


def _devices() -> dict[str, Any]:
    """NVML handles of every device, by UUID (empty where NVML cannot answer)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        found = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            found[uuid.decode() if isinstance(uuid, bytes) else str(uuid)] = handle
        return found
    except Exception:  # noqa: BLE001 - no NVML here (module, library or driver): no figure
        return {}


def _utilization(handle: Any) -> int | None:
    try:
        import pynvml

        return int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:  # noqa: BLE001 - the driver stopped answering (or a MIG device): the sample is skipped
        return None


class GpuBusy:
    """Samples each device's utilization while the block runs (see the module docstring)."""

    def __init__(self, interval_s: float = SAMPLE_S) -> None:
        self.interval_s = interval_s
        self._samples: dict[str, list[int]] = {}
        self._handles: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuBusy:
        self._handles = _devices()
        self._samples = {uuid: [] for uuid in self._handles}
        if self._handles:
            self._thread = threading.Thread(target=self._sample, name="kb-mcp-gpu-busy", daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            for uuid, handle in self._handles.items():
                value = _utilization(handle)
                if value is not None:
                    self._samples[uuid].append(value)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def by_device(self) -> dict[str, float]:
        """Each sampled device's busy share of the block (0..1), by UUID."""
        return {uuid: round(sum(s) / len(s) / 100.0, 4) for uuid, s in self._samples.items() if s}

    def share(self, gpus: int = 1) -> float | None:
        """The busy share of `gpus` GPUs over the block: the busiest `gpus` devices' shares summed, over
        `gpus` (the devices the run used are the busy ones on a machine lent to it); None without NVML."""
        shares = sorted(self.by_device().values(), reverse=True)[:max(1, gpus)]
        return round(sum(shares) / max(1, gpus), 4) if shares else None
