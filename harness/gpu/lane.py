"""The GPU lane: one timing or profiling at a time on each GPU, across every kb-mcp process of the
machine.

Two measurements sharing a GPU each measure the other's interference, and a baseline cached under
it skews every later speedup of that problem in a shared KB. So everything that times or profiles
holds the lane: the GPU tools for their whole call (`tools.base.on_gpu_lane`), and the harness
itself around each GPU request (`WorkerPool.verify` and `census`, `profiler.profile`, the work
census), so that a direct caller of the harness (a bench, a test, a script) cannot go around it. Holds are
re-entrant within a thread: the harness's hold inside a tool's is the tool's.

A hold is taken in two steps: this process's own lock (its threads take turns), then the GPU's
machine-wide lock file (`harness.lane_file`: `flock`, released by the kernel however its holder
ends), keyed by the GPU's UUID (`harness.gpu_key`). Where no GPU is visible there is no key and the
lane is this process's only (nothing measures); where the lock file cannot be used (the lane folder
is another user's, say) the hold is this process's only too, says why (`LaneHold.why_not`), and a
baseline measured under it is not cached (`WorkerPool`).

A waiter is told whom it waits for through its progress (each report is a cancellation point), as
"waiting for the GPU <key>: <what> (`<command>`, pid N, since ...)". Each hold is logged (logger
`kb_mcp.harness.lane`, INFO) as it is entered and left, with what it runs, the GPU key, whether it
was machine-wide, the pid and the thread, a CLOCK_MONOTONIC timestamp (one clock for every process
of a Linux machine, so the logs of two processes compare) and the wall clock. The entry is stamped
after the lock is taken and the exit before it is released, so two holds of one GPU never overlap
in the logs of any processes; `read_spans` and `overlapping` read that back.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict

from kb_mcp.harness.gpu.gpu_key import gpu_key
from kb_mcp.harness.gpu.lane_file import LaneFile, LaneHolder, LaneUnavailable, lane_dir
from kb_mcp.kb.progress import Progress, no_progress

__all__ = ["LaneHold", "LaneSpan", "current", "hold", "holder", "overlapping", "read_spans"]

log = logging.getLogger(__name__)

_REPORT_S = 2.0  # a waiting caller hears about it this often (each report is a cancellation point)
_POLL_S = 0.05  # how often a waiter tries the machine-wide lock
_LOG_WAIT_S = 60.0  # and how often the log says it still waits


class LaneHold(BaseModel):
    """One hold of the GPU lane, as its holder sees it."""

    model_config = ConfigDict(frozen=True)

    what: str
    gpu: str = ""  # the GPU key ('' where this process sees no GPU)
    machine: bool = False  # held machine-wide: no other kb-mcp process measures on this GPU meanwhile
    why_not: str = ""  # why it is held in this process only (no GPU, or the lane folder unusable)
    since: float = 0.0  # wall clock at entry

    @property
    def alone(self) -> bool:
        """Whether a measurement under this hold had the GPU to itself (what a cached baseline needs)."""
        return self.machine


class _Lane:
    """The process's lane: a lock for its threads, and the machine-wide lock file while held."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread ident of the holder
        self._depth = 0
        self.hold: LaneHold | None = None
        self._next = ""  # what holds this process's lock while it waits for the machine-wide one
        self._warned: set[str] = set()

    def owned(self) -> bool:
        return self._owner == threading.get_ident()

    @contextmanager
    def held(self, what: str, progress: Progress) -> Iterator[LaneHold]:
        if self.owned():
            self._depth += 1
            try:
                assert self.hold is not None
                yield self.hold
            finally:
                self._depth -= 1
            return
        start = time.monotonic()
        self._wait_here(progress)
        self._next = what
        try:
            now, lane_file = self._take_machine(what, progress, start)
        except BaseException:
            self._next = ""
            self._lock.release()  # a cancelled wait leaves nothing held
            raise
        self._next = ""
        entered = time.monotonic()  # stamped after the lock file is taken
        self._owner, self._depth, self.hold = threading.get_ident(), 1, now
        _log_event(now, "entered after waiting", entered - start, entered)
        try:
            yield now
        finally:
            left = time.monotonic()  # stamped before the lock file is released
            _log_event(now, "left after", left - entered, left)
            self._owner, self._depth, self.hold = None, 0, None
            if lane_file is not None:
                lane_file.unlock()
            self._lock.release()

    def _wait_here(self, progress: Progress) -> None:
        """Takes this process's lock, telling the caller who in this process holds the lane."""
        if self._lock.acquire(blocking=False):
            return
        while True:
            now, next_ = self.hold, self._next
            busy = (f"{now.what} is running in this process (pid {os.getpid()}, since {_clock(now.since)})" if now
                    else f"{next_}, next in this process, waits for another process" if next_
                    else "another profile or verification is running in this process")
            # A report may raise (a cancelled call or job): nothing is held yet, so that is safe.
            progress(0, None, f"waiting for the GPU{_named(now.gpu if now else '')}: {busy}")
            if self._lock.acquire(timeout=_REPORT_S):
                return

    def _take_machine(self, what: str, progress: Progress, start: float) -> tuple[LaneHold, LaneFile | None]:
        """Takes the GPU's lock file (waiting, with reports, while another process holds it)."""
        since = time.time()
        key = gpu_key()
        if key is None:
            return LaneHold(what=what, since=since, why_not="no GPU is visible to this process"), None
        if key.source == "fallback" and key.note not in self._warned:
            self._warned.add(key.note)
            log.warning("gpu lane: the GPU is keyed %r, not by its UUID (%s): only processes that key it the same "
                        "way take turns on it", key.key, key.note)
        try:
            lane_file = LaneFile(lane_dir(), key.key)
            free = lane_file.try_lock()
        except LaneUnavailable as exc:
            if str(exc) not in self._warned:
                self._warned.add(str(exc))
                log.warning("gpu lane: %s; this process's measurements do not take turns with other processes'", exc)
            return LaneHold(what=what, gpu=key.key, since=since, why_not=str(exc)), None
        try:
            reported = logged = -_LOG_WAIT_S
            while not free:
                waited = time.monotonic() - start
                if waited - reported >= _REPORT_S or waited - logged >= _LOG_WAIT_S:
                    found = lane_file.holder()
                    busy = found.describe(socket.gethostname()) if found else "a process that left no record"
                    if waited - logged >= _LOG_WAIT_S:
                        logged = waited
                        log.info("gpu lane: %s waits for the GPU %s: %s", what, key.key, busy)
                    if waited - reported >= _REPORT_S:
                        reported = waited
                        progress(0, None, f"waiting for the GPU {key.key}: {busy}")
                time.sleep(_POLL_S)
                free = lane_file.try_lock()
        except BaseException:
            lane_file.close()
            raise
        since = time.time()
        lane_file.record(LaneHolder(gpu=key.key, what=what, pid=os.getpid(), host=socket.gethostname(),
                                    user=_user(), command=_COMMAND, since=since))
        return LaneHold(what=what, gpu=key.key, machine=True, since=since), lane_file


def _command() -> str:
    """This process's command line, short: how a waiter tells which kb-mcp holds the GPU."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    first = "kb-mcp" if getattr(main, "name", "") == "kb_mcp.server.cli" else os.path.basename(sys.argv[0])
    return " ".join([first, *sys.argv[1:4]])[:120]


_LANE = _Lane()
_COMMAND = _command()


@contextmanager
def hold(what: str, progress: Progress = no_progress) -> Iterator[LaneHold]:
    """Holds the GPU lane for the block, waiting (and reporting whom for, through `progress`) while
    another thread or process holds it; re-entrant within a thread (an inner hold is the outer one)."""
    with _LANE.held(what, progress) as now:
        yield now


def current() -> LaneHold | None:
    """This thread's hold of the lane, None when it holds none."""
    return _LANE.hold if _LANE.owned() else None


def holder() -> str:
    """What holds the lane in this process now ('' when no thread of it does)."""
    now = _LANE.hold
    return now.what if now else ""


def _log_event(now: LaneHold, event: str, seconds: float, t: float) -> None:
    wall = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    log.info("gpu lane: %s %s %.3f s [gpu=%s scope=%s pid=%d t=%.6f wall=%s thread=%s]", now.what, event, seconds,
             now.gpu or "none", "machine" if now.machine else "process", os.getpid(), t, wall,
             threading.current_thread().name)


def _named(gpu: str) -> str:
    return f" {gpu}" if gpu else ""


def _clock(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).strftime("%H:%M:%S UTC")


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


# -- reading holds back from logs -----------------------------------------------------------------

_EVENT = re.compile(
    r"gpu lane: (?P<what>.+?) (?P<event>entered|left) after (?:waiting )?(?P<secs>[\d.]+) s "
    r"\[gpu=(?P<gpu>\S+) scope=(?P<scope>\w+) pid=(?P<pid>\d+) t=(?P<t>[\d.]+) wall=(?P<wall>\S+) "
    r"thread=(?P<thread>[^\]]*)\]")


class LaneSpan(BaseModel):
    """One hold read back from a log: from entry to exit, on the machine-wide monotonic clock."""

    what: str
    gpu: str
    machine: bool
    pid: int
    thread: str
    waited_s: float
    start: float
    end: float


def read_spans(text: str) -> list[LaneSpan]:
    """The holds logged in `text` (one process's log or several concatenated), each entry paired
    with its exit; raises ValueError on an exit without its entry or an entry never left."""
    spans: list[LaneSpan] = []
    open_: dict[tuple[int, str], dict[str, str]] = {}
    for m in _EVENT.finditer(text):
        at = (int(m["pid"]), m["thread"])
        if m["event"] == "entered":
            if at in open_:
                raise ValueError(f"pid {at[0]} thread {at[1]} entered the lane twice without leaving it")
            open_[at] = m.groupdict()
            continue
        entry = open_.pop(at, None)
        if entry is None or entry["what"] != m["what"]:
            raise ValueError(f"an exit of the lane without its entry: {m.group(0)}")
        spans.append(LaneSpan(what=m["what"], gpu=m["gpu"], machine=m["scope"] == "machine", pid=at[0],
                              thread=at[1], waited_s=float(entry["secs"]), start=float(entry["t"]),
                              end=float(m["t"])))
    if open_:
        raise ValueError(f"holds never left: {sorted(open_)}")
    return spans


def overlapping(spans: list[LaneSpan]) -> list[tuple[LaneSpan, LaneSpan]]:
    """Pairs of holds of one GPU that intersect in time (none, when the lane works). Holds without a
    GPU (`gpu=none`) are each process's own: only those of one process are compared."""

    def gpu(span: LaneSpan) -> str:
        return span.gpu if span.gpu != "none" else f"none@{span.pid}"

    found = []
    ordered = sorted(spans, key=lambda s: (gpu(s), s.start))
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if gpu(b) != gpu(a) or b.start >= a.end:
                break
            found.append((a, b))
    return found
