"""A profiling driver started ahead of the request, under ncu, waiting for its spec.

A fresh profile spends most of its wall time before ncu sees a kernel: starting Python,
importing torch and creating the CUDA context (7.5 of 10.5 s for a one-kernel candidate on an
H100, docs/benchmarks.md). After each profile the profiler therefore starts the next driver
in standby (`profile_driver --standby`): it pays that start-up while the agent is writing the
next candidate, then waits for a spec in its rendezvous folder. A request hands the spec over
and only pays for loading, warm-up, the profiled forward and the report. A server on a GPU machine
starts one the same way when it starts (`profiler.start_standby`, from `kb_mcp.server.prewarm`), for
the options of a request that sets none, so that its first profile is warm too.

The pool keeps at most one standby, for one `StandbyKey` (the ncu command line it was started
with); a request with other options drains it and runs cold, so two ncu sessions of one pool
never overlap. A standby exits by itself after `idle_s`, and dies with the server (its sandbox
does; unconfined, it watches its owner process). Its rendezvous folder is its sandbox's scratch:
the only place it can write.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kb_mcp.harness.protocol import CLAIMED_FILE, READY_FILE, SPEC_FILE, DriverSpec
from kb_mcp.kb import settings
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.owners import process_alive

ENV_STANDBY = "KB_MCP_PROFILE_STANDBY"  # "0" turns standby drivers off (every profile starts cold)
DEFAULT_IDLE_S = 900.0
# A standby this close to its idle limit may exit while the spec is being written: not handed out.
IDLE_MARGIN_S = 30.0


@dataclass(frozen=True)
class StandbyKey:
    """What a standby was started with; a request can use it only if it asks for the same."""

    ncu: str
    source_counters: bool
    max_kernels: int
    metrics: tuple[str, ...]
    env_key: str  # the driver environment that matters (the build cache it reuses)


class NcuLike(Protocol):
    """What the pool needs of a started process (`profiler.NcuProcess` is one)."""

    def alive(self) -> bool: ...

    def kill(self) -> None: ...


class Standby:
    """One waiting driver: its process (ncu and the driver under it) and its rendezvous folder."""

    def __init__(self, key: StandbyKey, folder: Path, process: NcuLike) -> None:
        self.key = key
        self.folder = folder
        self.process = process
        self.started = time.monotonic()

    @property
    def report_base(self) -> Path:
        """Where ncu exports this standby's report (`.ncu-rep` is appended)."""
        return self.folder / "report"

    def ready(self) -> bool:
        """Whether the driver has finished its start-up and is waiting."""
        return (self.folder / READY_FILE).is_file()

    def age_s(self) -> float:
        """Seconds since it was started."""
        return time.monotonic() - self.started

    def hand_over(self, spec: DriverSpec) -> None:
        """Gives the driver its spec (written whole, then renamed: the driver never reads half a file)."""
        write_atomic(self.folder / SPEC_FILE, spec.model_dump_json())

    def claimed(self) -> bool:
        """Whether the driver took the spec (False: it had exited before the spec came)."""
        return (self.folder / CLAIMED_FILE).is_file()

    def close(self) -> None:
        """Stops the process if it still runs and removes the folder."""
        if self.process.alive():
            self.process.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


# Starts the process of a standby whose rendezvous folder is the argument.
Launcher = Callable[[Path], NcuLike]


def standby_enabled() -> bool:
    """False when $KB_MCP_PROFILE_STANDBY is 0/false/no/off, True when unset or 1/true/yes/on; any other
    value is refused by name (`kb.errors.SettingError`)."""
    return settings.switch(ENV_STANDBY, True)


def driver_args(folder: Path, idle_s: float, owner: int | None = None) -> list[str]:
    """The driver's arguments for standby in `folder`. `owner`: a process whose end ends the driver
    (needed only unconfined: a sandboxed driver dies with the process that started its sandbox, and
    cannot see other processes anyway)."""
    args = ["--standby", str(folder), "--idle-s", str(idle_s)]
    return args + (["--owner", str(owner)] if owner is not None else [])


def sweep(root: Path) -> None:
    """Removes rendezvous folders left by processes that died without closing their pool."""
    for folder in root.glob("standby-*-*"):
        try:
            pid = int(folder.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if not process_alive(pid):
            shutil.rmtree(folder, ignore_errors=True)


class StandbyPool:
    """At most one standby driver, started after each profile for the next one, and by a server at
    its start for its first one (thread-safe)."""

    def __init__(self, root: Path, *, idle_s: float = DEFAULT_IDLE_S) -> None:
        self.root = root
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._waiting: Standby | None = None
        self._closed = False
        # Metrics this ncu/GPU refused once: later command lines (standby or cold) leave them out.
        self.dropped_metrics: set[str] = set()
        self.disabled_reason: str | None = None  # e.g. counters refused: no point in standing by
        sweep(root)

    @property
    def waiting(self) -> Standby | None:
        """The standby waiting now, if any (it stays in the pool; `take` hands it out)."""
        return self._waiting

    def metrics(self, wanted: Sequence[str]) -> list[str]:
        """`wanted` without the metrics dropped before."""
        return [m for m in wanted if m not in self.dropped_metrics]

    def take(self, key: StandbyKey) -> Standby | None:
        """The waiting standby if it matches `key` and is usable; otherwise drains it and returns None."""
        with self._lock:
            standby, self._waiting = self._waiting, None
        if standby is None:
            return None
        usable = (standby.key == key and standby.process.alive()
                  and standby.age_s() < self.idle_s - IDLE_MARGIN_S)
        if usable:
            return standby
        standby.close()  # a different command line, or gone: never two ncu sessions of one pool at once
        return None

    def launch(self, key: StandbyKey, launcher: Launcher) -> Standby | None:
        """Starts a standby for `key` unless one waits already, the pool is closed, or disabled."""
        if self.disabled_reason is not None or not standby_enabled():
            return None
        with self._lock:
            # Checked under the lock: a pool closed meanwhile (its server stopping) starts nothing
            # that no one would stop.
            if self._closed or self._waiting is not None:
                return None
            folder = self.root / f"standby-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            folder.mkdir(parents=True, exist_ok=True)
            try:
                standby = Standby(key, folder, launcher(folder))
            except OSError:
                shutil.rmtree(folder, ignore_errors=True)
                return None  # cannot start it: the next profile simply runs cold
            self._waiting = standby
            return standby

    def wait_ready(self, timeout_s: float) -> bool:
        """Waits until the waiting standby (if any) has finished its start-up; False if none does in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            standby = self._waiting
            if standby is None or not standby.process.alive():
                return False
            if standby.ready():
                return True
            time.sleep(0.05)
        return False

    def disable(self, reason: str) -> None:
        """No more standbys (e.g. counters are refused on this machine); drains the waiting one."""
        self.disabled_reason = reason
        self.drain()

    def drain(self) -> None:
        """Stops the waiting standby, if any."""
        with self._lock:
            standby, self._waiting = self._waiting, None
        if standby is not None:
            standby.close()

    def close(self) -> None:
        """Stops the waiting standby and starts no more."""
        with self._lock:
            self._closed = True
        self.drain()
