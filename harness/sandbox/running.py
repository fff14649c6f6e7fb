"""Sandboxed processes one owner started, so that another thread can stop them all at once.

A build service or compile-only checker that works ahead of verifications (an eval building the next
solutions while the GPU verifies the current one, `harness.builds.ahead`) runs its compilers on threads of
its own. When the eval ends early (Ctrl-C, an error), `Running.stop` kills every process they still
run and refuses new ones, so no compiler keeps working, or holds a build lock, after the eval has
ended. The processes are started through `Sandbox.popen` as any other, with the owner's limits (a
lower CPU priority for work that may wait).
"""

from __future__ import annotations

import dataclasses
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

from kb_mcp.harness.sandbox.sandbox import Grant, Limits, Role, Sandbox, finish, kill_group, limits_for

__all__ = ["Running", "Stopped"]


class Stopped(RuntimeError):
    """The owner was stopped: nothing more is started for it (ours: the work it was asked for was cancelled)."""


class Running:
    """The processes started for one owner; `stop` kills them all and refuses new ones. Thread-safe."""

    def __init__(self, nice: int = 0) -> None:
        self.nice = nice
        self._procs: set[subprocess.Popen[Any]] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self.started = 0  # processes started, in all
        self.peak = 0  # the most that ran at once

    @property
    def stopped(self) -> bool:
        """Whether `stop` was called."""
        return self._stopped

    def limits(self, role: Role) -> Limits:
        """The role's limits, at this owner's niceness."""
        return dataclasses.replace(limits_for(role), nice=self.nice)

    def popen(self, sandbox: Sandbox, command: Sequence[str], grant: Grant, **kwargs: Any) -> subprocess.Popen[Any]:
        """`sandbox.popen(command, grant, ...)`, tracked until `release`; raises Stopped once stopped."""
        if self._stopped:
            raise Stopped("stopped: no more processes are started")
        proc = sandbox.popen(command, grant, limits=self.limits(grant.role), **kwargs)
        with self._lock:
            self._procs.add(proc)
            self.started += 1
            self.peak = max(self.peak, sum(1 for p in self._procs if p.poll() is None))
            late = self._stopped
        if late:  # stopped while it started: it must not outlive the stop
            kill_group(proc)
        return proc

    def release(self, proc: subprocess.Popen[Any]) -> None:
        """Forgets a process that has ended (killing its group if it has not)."""
        kill_group(proc)
        with self._lock:
            self._procs.discard(proc)

    def run(self, sandbox: Sandbox, command: Sequence[str], grant: Grant, *, timeout_s: float) -> tuple[int, str]:
        """Runs `command` to its end as `Sandbox.run` does: (return code, output); -9 when it was
        killed (at `timeout_s`, or by `stop`). Raises Stopped when stopped before it started."""
        proc = self.popen(sandbox, command, grant, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            return finish(proc, timeout_s)
        finally:
            self.release(proc)

    def stop(self) -> None:
        """Kills every process still running for this owner; later starts raise Stopped."""
        with self._lock:
            self._stopped = True
            procs = list(self._procs)
        for proc in procs:
            kill_group(proc)

    def alive(self) -> int:
        """How many of its processes still run."""
        with self._lock:
            return sum(1 for p in self._procs if p.poll() is None)
