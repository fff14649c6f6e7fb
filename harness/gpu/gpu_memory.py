"""The device's memory in use, every process included, sampled while a request runs (server side).

A verification's memory is spread over several processes (the verify worker, the census worker,
the profiling driver of a work census, idle spares holding their CUDA contexts), each with its own
caching allocator; none of them sees the others. The driver does: NVML's per-device "used" figure
counts every context and allocation on the GPU. `DeviceMemory` polls it from a thread of the server
while a request runs (`WorkerPool.verify`) and keeps the highest value, so a verification reports
the peak of all harness processes together (`MemoryReport.device_peak_bytes`).

NVML comes from NVIDIA's own binding (`nvidia-ml-py`, module `pynvml`). Where it is missing or the
driver refuses (no GPU, a container without NVML), the figure is None and the report falls back to
what the workers' allocators say (`MemoryReport.peak_gib`); nothing else depends on it. The device is
found by the UUID the worker reported (`WorkerInfo.uuid`), so CUDA_VISIBLE_DEVICES cannot make it
read another GPU.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

__all__ = ["DeviceMemory"]

SAMPLE_S = 0.02  # a sample every 20 ms: NVML's query costs microseconds; a peak shorter than this can be missed


def _handle(uuid: str) -> Any | None:
    """An NVML handle of the device with this UUID, or None where NVML cannot give one."""
    if not uuid:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:  # noqa: BLE001 - no NVML here (module, library or driver): the figure is unknown
        return None


def _used(handle: Any) -> int | None:
    try:
        import pynvml

        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # noqa: BLE001 - the driver stopped answering: the sample is skipped
        return None


class DeviceMemory:
    """Samples a device's memory in use while the block runs: `idle` (at entry) and `peak` bytes.

    Both stay None where NVML is unavailable (see the module's docstring)."""

    def __init__(self, uuid: str, interval_s: float = SAMPLE_S) -> None:
        self.uuid = uuid
        self.interval_s = interval_s
        self.idle: int | None = None
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: Any | None = None

    def __enter__(self) -> DeviceMemory:
        self._handle = _handle(self.uuid)
        if self._handle is None:
            return self
        self.idle = self.peak = _used(self._handle)
        self._thread = threading.Thread(target=self._sample, name="kb-mcp-device-memory", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._note(_used(self._handle))

    def _note(self, used: int | None) -> None:
        if used is not None and (self.peak is None or used > self.peak):
            self.peak = used

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._note(_used(self._handle))

    @staticmethod
    def available(uuid: str) -> bool:
        """Whether NVML answers for the device with this UUID."""
        return _handle(uuid) is not None

