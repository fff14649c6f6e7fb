"""The eval's pipeline: one problem at a time on the GPU, the next problems' builds ahead on the CPU.

The GPU verifies problems one after another (one lane, and one timing at a time); what the CPU cores
can do meanwhile is build the solutions that come next. `Pipeline` holds that second side: work items
submitted in the order the steps will take them, run on at most `jobs` threads, and `claim(key)`
before an item's step waits until that item's work is done (its build, already running or just
starting, is exactly what the step would otherwise wait for inside its verification, with the GPU
lane held). The step itself is the caller's, so an eval that times baselines instead of verifying
solutions uses the same pipeline with a step of its own (and, with nothing to build, no work ahead).

While a claim waits, the GPU would be idle (the first builds of an eval have nothing to hide behind):
`claim(key, idle=...)` lets the caller give it other work meanwhile, one piece at a time (the eval
times the baselines of problems not cached yet, `campaign.evaluate`), until the awaited work is done
or the caller has nothing left. A piece already started runs to its end, so the step may start a little
after its build is done; the seconds it took are the caller's to count, not the wait's.

Work ahead is never part of an outcome: its result is only counted, and what it raised is only
logged. Leaving the `with` block (the end, an error, Ctrl-C) cancels what has not started, calls
`stop` (which kills the processes still running, `harness.builds.ahead.BuildsAhead.stop`) and waits for the
threads, so nothing keeps building after the eval.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import threading
import time
from collections.abc import Callable, Hashable
from types import TracebackType
from typing import Generic, TypeVar

__all__ = ["Pipeline"]

T = TypeVar("T")
R = TypeVar("R")

WAIT_REPORT_S = 2.0  # a step waiting for its work ahead hears of it this often (a point where it may be cancelled)


class Pipeline(Generic[T, R]):
    """Work ahead of the steps (`work(item)`, on `jobs` threads); see the module docstring.

    With `jobs` 0 nothing runs ahead: `submit` does nothing and every claim returns at once (the
    serial eval).
    """

    def __init__(self, work: Callable[[T], R], jobs: int, stop: Callable[[], None] = lambda: None,
                 log: Callable[[str], None] = lambda message: None) -> None:
        self.work, self.jobs, self._stop, self.log = work, max(0, jobs), stop, log
        self._pool: cf.ThreadPoolExecutor | None = None
        self._futures: dict[Hashable, cf.Future[R]] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Pipeline[T, R]:
        if self.jobs:
            self._pool = cf.ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="kb-mcp-ahead")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def submit(self, key: Hashable, item: T) -> None:
        """Queues `work(item)`, to run once a thread is free (items start in the order submitted)."""
        if self._pool is None:
            return
        with self._lock:
            # in the submitter's context: a build is made for the same client as the verification it serves
            self._futures[key] = self._pool.submit(contextvars.copy_context().run, self.work, item)

    def counts(self) -> tuple[int, int]:
        """(items whose work is done, items submitted)."""
        with self._lock:
            futures = list(self._futures.values())
        return sum(f.done() for f in futures), len(futures)

    def ready(self, key: Hashable) -> bool:
        """Whether a claim of `key` would return at once (its work is done, or it has none)."""
        with self._lock:
            future = self._futures.get(key)
        return future is None or future.done()

    def claim(self, key: Hashable, waiting: Callable[[float], None] = lambda s: None,
              idle: Callable[[], bool] | None = None) -> tuple[float, R | None]:
        """Waits until the work of `key` is done: (seconds waited, its result, or None when it had none
        or failed). `waiting(seconds)` is called every few seconds while it waits; it may raise to
        stop the eval. `idle()`, while the work is not done, does one piece of the caller's own work
        and says whether it did any (False: nothing left, it is not called again); the seconds it
        took are not counted as waited."""
        with self._lock:
            future = self._futures.get(key)
        if future is None:
            return 0.0, None
        t0 = time.monotonic()
        busy = 0.0
        while idle is not None and not future.done():
            started = time.monotonic()
            if not idle():
                break
            busy += time.monotonic() - started
        while True:
            try:
                result = future.result(timeout=WAIT_REPORT_S)
                return time.monotonic() - t0 - busy, result
            except cf.TimeoutError:
                waiting(time.monotonic() - t0 - busy)
            except cf.CancelledError:
                return time.monotonic() - t0 - busy, None
            except Exception as exc:  # noqa: BLE001 - ours, and never the outcome's: the step builds on demand
                self.log(f"work ahead of {key} failed ({type(exc).__name__}: {exc}); its step builds on demand")
                return time.monotonic() - t0 - busy, None

    def close(self) -> None:
        """Cancels work not started, stops what runs (`stop`) and waits for the threads to end."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for future in self._futures.values():
            future.cancel()  # those not started yet
        self._stop()  # those running: their processes are killed, so their threads end at once
        pool.shutdown(wait=True, cancel_futures=True)
