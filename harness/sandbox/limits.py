"""The resource limits of a sandboxed process, per role (`setrlimit`, niceness), and what runs in the
child between fork and exec to set them (and, unconfined, the parent-death signal)."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["worker", "build", "compiler", "driver", "tool"]

_GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed process (and what it starts). None: no limit."""

    cpu_s: int | None = None  # CPU seconds (the pool's wall-clock limits stop a hang first)
    data_bytes: int | None = None  # data segment: heap and private writable mappings (not CUDA's reservations)
    file_bytes: int | None = 4 * _GiB  # largest file it may write
    processes: int | None = 512  # processes of its user (only the kernel's non-root users are counted)
    open_files: int = 65536
    nice: int = 0  # added to the scheduling niceness (work that may wait, such as builds ahead)


def _ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover
        return 64 * _GiB


def limits_for(role: Role) -> Limits:
    """The limits of a role. Workers and drivers are long-lived and hold torch and CUDA: half the
    machine's memory; compilers and builds less, and a CPU budget."""
    half = max(8 * _GiB, _ram() // 2)
    if role == "compiler":
        return Limits(cpu_s=900, data_bytes=min(half, 16 * _GiB), file_bytes=1 * _GiB, processes=256)
    if role == "build":
        return Limits(cpu_s=3600, data_bytes=half, file_bytes=4 * _GiB, processes=512)
    if role == "tool":
        return Limits(cpu_s=900, data_bytes=half, file_bytes=4 * _GiB, processes=128)
    if role == "driver":
        return Limits(data_bytes=half, file_bytes=16 * _GiB, processes=512)
    return Limits(data_bytes=half, file_bytes=4 * _GiB, processes=512)



_PR_SET_PDEATHSIG = 1


def _preexec(limits: Limits, pdeathsig: bool) -> Any:
    """What runs in the child between fork and exec: limits, and (unconfined) the parent-death signal."""
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    pairs = [(resource.RLIMIT_NOFILE, limits.open_files)]
    for rlim, value in ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_DATA, limits.data_bytes),
                        (resource.RLIMIT_FSIZE, limits.file_bytes), (resource.RLIMIT_NPROC, limits.processes)):
        if value is not None:
            pairs.append((rlim, value))
    wanted = [(rlim, min(value, hard) if hard != resource.RLIM_INFINITY else value)
              for rlim, value in pairs for hard in [resource.getrlimit(rlim)[1]]]
    kill = int(signal.SIGKILL)
    nice = limits.nice

    def run() -> None:
        for rlim, value in wanted:
            try:
                resource.setrlimit(rlim, (value, value))
            except (ValueError, OSError):
                pass
        if nice > 0:
            os.nice(nice)
        if pdeathsig:
            prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)

    return run
