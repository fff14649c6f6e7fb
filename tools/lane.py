"""The GPU lane: one timing or profiling at a time in a process.

Two measurements sharing a GPU each measure the other's interference, so every path that times
or profiles (MCP calls, jobs, the campaign, `kb-mcp call`) takes this one lane, held by the
process's `ToolContext`. The tool modules that time or profile declare it (`ToolMeta.uses_gpu`)
and their `run` holds the lane for the whole call (`tools.base.on_gpu_lane`), so no caller can
go around it.

Each entry and exit is logged (logger `kb_mcp.tools.lane`, INFO) with the holder, the wait and a
monotonic timestamp, which tells an operator why a call waited and lets a test prove that no two
holds overlapped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from kb_mcp.kb.progress import Progress, no_progress

__all__ = ["GpuLane"]

log = logging.getLogger(__name__)

_WAIT_REPORT_S = 2.0  # a waiting caller hears about it this often (each report is a cancellation point)


class GpuLane:
    """A lock for GPU work that says who holds it, reports waiting as progress, and logs each hold.

    Re-entrant per thread: a tool that holds the lane may call another GPU tool's function.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread ident of the holder
        self._depth = 0
        self._holder = ""

    @property
    def holder(self) -> str:
        """Who holds the lane now ('' when free)."""
        return self._holder

    @contextmanager
    def hold(self, holder: str, progress: Progress = no_progress) -> Iterator[None]:
        """Holds the lane for the block; waits (reporting progress) while someone else holds it."""
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        waited = self._acquire(holder, progress)
        self._owner, self._depth, self._holder = me, 1, holder
        entered = time.monotonic()
        log.info("gpu lane: %s entered after waiting %.3f s [t=%.6f thread=%s]",
                 holder, waited, entered, threading.current_thread().name)
        try:
            yield
        finally:
            left = time.monotonic()
            log.info("gpu lane: %s left after %.3f s [t=%.6f thread=%s]",
                     holder, left - entered, left, threading.current_thread().name)
            self._owner, self._depth, self._holder = None, 0, ""
            self._lock.release()

    def _acquire(self, holder: str, progress: Progress) -> float:
        """Takes the lock; returns the seconds spent waiting for it."""
        if self._lock.acquire(blocking=False):
            return 0.0
        start = time.monotonic()
        while True:
            busy = self._holder or "another profile or verification"
            # A report may raise (a cancelled call or job): nothing is held yet, so that is safe.
            progress(0, None, f"waiting for the GPU: {busy} is running in this server")
            if self._lock.acquire(timeout=_WAIT_REPORT_S):
                return time.monotonic() - start
