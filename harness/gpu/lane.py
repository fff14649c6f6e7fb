"""The GPU lane: one timing or profiling at a time on each GPU, across every kb-mcp process of the
machine.

Two measurements sharing a GPU each measure the other's interference, and a baseline cached under
it skews every later speedup of that problem in a shared KB. So everything that times or profiles
holds the lane: the harness itself around each GPU request (`WorkerPool.verify` and `census`,
`profiler.profile`, the work census), so that a direct caller of the harness (a bench, a test, a
script) cannot go around it, and the GPU tools whose whole call is GPU work (`tools.base.on_gpu_lane`);
`compile_and_verify` leaves it to the harness (`tools.base.gpu_lane_inside`), which takes it for the
GPU work only, after the candidate's build. Holds are
re-entrant within a thread: the harness's hold inside a tool's is the tool's.

A hold is taken in two steps: a ticket in the GPU's line (`harness.gpu.lane_queue`: first come, first
served across every thread and process of the machine, stale tickets of dead waiters reaped), then,
first in line, the GPU's machine-wide lock file (`harness.gpu.lane_file`: `flock`, released by the kernel
however its holder ends), keyed by the GPU's UUID (`harness.gpu.gpu_key`). Where no GPU is visible there
is no key and the lane is this process's only (nothing measures; its threads still take turns in
arrival order); where the lock file cannot be used (the lane folder is another user's, say) the hold
is this process's only too, says why (`LaneHold.why_not`), and a baseline measured under it is not
cached (`WorkerPool`).

A waiter is told whom it waits for and its place in line through its progress (each report is a
cancellation point, and a cancelled waiter leaves the line), as "waiting for the GPU <key>: <what>
(`<command>`, pid N, since ...) [place 3 in line: 2 ahead]"; its hold says how long it waited and
how many were ahead of it (`LaneHold.waited_s`, `place`). Each hold is logged (logger
`kb_mcp.harness.gpu.lane`, INFO) as it is entered and left, with what it runs, the GPU key, whether it
was machine-wide, the pid, its place and ticket and the thread, a CLOCK_MONOTONIC timestamp (one clock for every process
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict

from kb_mcp.harness.gpu.gpu_key import gpu_key
from kb_mcp.harness.gpu.lane_file import ENV_LANE_DIR, LaneFile, LaneHolder, LaneUnavailable, lane_dir
from kb_mcp.harness.gpu.lane_queue import LaneLine, LaneTicket, Ticket
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
    waited_s: float = 0.0  # how long it waited for the lane
    place: int = 0  # how many holds were ahead of it in line as it arrived (the holder's included)
    ticket: int = -1  # its number in the GPU's machine-wide line (-1: the process's own line)

    @property
    def alone(self) -> bool:
        """Whether a measurement under this hold had the GPU to itself (what a cached baseline needs)."""
        return self.machine


class _ProcessLine:
    """The lane where it is this process's only (no GPU key, or the lane folder unusable): its
    threads in one line, first come first served, the head of the line holding it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._line: list[int] = []
        self._next = 0

    def take(self, what: str, progress: Progress, busy: Callable[[], str]) -> tuple[int, Callable[[], None]]:
        """Waits for this thread's turn; (how many were ahead at arrival, the release)."""
        with self._cond:
            ticket, self._next = self._next, self._next + 1
            self._line.append(ticket)
            place = len(self._line) - 1

        def release() -> None:
            with self._cond:
                self._line.remove(ticket)
                self._cond.notify_all()

        try:
            while True:
                with self._cond:
                    if self._line[0] == ticket:
                        return place, release
                    ahead = self._line.index(ticket)
                # A report may raise (a cancelled call or job): the ticket leaves the line below.
                progress(0, None, f"waiting for the GPU: {busy()}{_in_line(ahead)}")
                with self._cond:
                    if self._cond.wait_for(lambda: self._line[0] == ticket, _REPORT_S):
                        return place, release
        except BaseException:
            release()
            raise


class _Lane:
    """The process's side of the lane: each thread's hold (re-entrant), and the line it waits in,
    the machine-wide one where it can be used (`harness.gpu.lane_queue`, then the lock file), else the
    process's own."""

    def __init__(self) -> None:
        self._local = threading.local()  # .hold and .depth of this thread
        self.hold: LaneHold | None = None  # what holds the lane in this process now
        self._process = _ProcessLine()
        self._warned: set[str] = set()

    def owned(self) -> bool:
        return getattr(self._local, "hold", None) is not None

    def mine(self) -> LaneHold | None:
        return getattr(self._local, "hold", None)

    @contextmanager
    def held(self, what: str, progress: Progress) -> Iterator[LaneHold]:
        mine = self.mine()
        if mine is not None:
            self._local.depth += 1
            try:
                yield mine
            finally:
                self._local.depth -= 1
            return
        start = time.monotonic()
        now, release = self._take(what, progress, start)
        entered = time.monotonic()  # stamped after the lock file is taken
        now = now.model_copy(update={"waited_s": round(entered - start, 3)})
        self._local.hold, self._local.depth, self.hold = now, 1, now
        _log_event(now, "entered after waiting", entered - start, entered)
        try:
            yield now
        finally:
            left = time.monotonic()  # stamped before the lock file is released
            _log_event(now, "left after", left - entered, left)
            self._local.hold, self._local.depth, self.hold = None, 0, None
            release()

    def _take(self, what: str, progress: Progress, start: float) -> tuple[LaneHold, Callable[[], None]]:
        """Waits in the machine-wide line of the GPU, or where there is none, in this process's."""
        key = gpu_key()
        if key is None:
            return self._take_process(what, progress, "no GPU is visible to this process", "")
        if key.source == "fallback" and key.note not in self._warned:
            self._warned.add(key.note)
            log.warning("gpu lane: the GPU is keyed %r, not by its UUID (%s): only processes that key it the same "
                        "way take turns on it", key.key, key.note)
        try:
            return self._take_machine(what, progress, start, key.key)
        except LaneUnavailable as exc:
            if str(exc) not in self._warned:
                self._warned.add(str(exc))
                log.warning("gpu lane: %s; this process's measurements do not take turns with other processes'", exc)
            return self._take_process(what, progress, str(exc), key.key)

    def _take_process(self, what: str, progress: Progress, why_not: str,
                      gpu: str) -> tuple[LaneHold, Callable[[], None]]:
        def busy() -> str:
            now = self.hold
            return (f"{now.what} is running in this process (pid {os.getpid()}, since {_clock(now.since)})" if now
                    else "another profile or verification of this process is next")

        place, release = self._process.take(what, progress, busy)
        return LaneHold(what=what, gpu=gpu, since=time.time(), why_not=why_not, place=place), release

    def _take_machine(self, what: str, progress: Progress, start: float,
                      key: str) -> tuple[LaneHold, Callable[[], None]]:
        """Takes a ticket in the GPU's line, then, first in line, its lock file (reporting whom it
        waits for and its place meanwhile)."""
        folder = lane_dir()
        lane_file, line = LaneFile(folder, key), LaneLine(folder, key)
        try:
            ticket = line.join(LaneTicket(what=what, pid=os.getpid(), host=socket.gethostname(),
                                          thread=threading.current_thread().name, since=time.time()))
        except OSError as exc:
            raise LaneUnavailable(exc.errno or 0, f"cannot take a ticket in the GPU lane's line in {folder}: "
                                  f"{exc.strerror or exc}; set {ENV_LANE_DIR} to a folder every kb-mcp of this "
                                  "machine can write") from exc
        try:
            place = self._wait_turn(what, progress, start, key, lane_file, line, ticket)
        except BaseException:
            lane_file.close()
            line.leave(ticket)
            raise
        since = time.time()
        lane_file.record(LaneHolder(gpu=key, what=what, pid=os.getpid(), host=socket.gethostname(),
                                    user=_user(), command=_COMMAND, since=since))

        def release() -> None:
            lane_file.unlock()
            line.leave(ticket)

        return LaneHold(what=what, gpu=key, machine=True, since=since, place=place, ticket=ticket.number), release

    @staticmethod
    def _wait_turn(what: str, progress: Progress, start: float, key: str, lane_file: LaneFile, line: LaneLine,
                   ticket: Ticket) -> int:
        """Waits until the ticket is first in line and the lock file is free; how many were ahead at arrival."""
        place: int | None = None
        reported = logged = -_LOG_WAIT_S
        while True:
            ahead = line.ahead(ticket)
            if place is None:
                place = len(ahead)
            if not ahead and lane_file.try_lock():
                return place
            waited = time.monotonic() - start
            if waited - reported >= _REPORT_S or waited - logged >= _LOG_WAIT_S:
                busy = _busy(lane_file, ahead)
                if waited - logged >= _LOG_WAIT_S:
                    logged = waited
                    log.info("gpu lane: %s waits for the GPU %s: %s%s", what, key, busy, _in_line(len(ahead)))
                if waited - reported >= _REPORT_S:
                    reported = waited
                    # A report may raise (a cancelled call or job): the caller leaves the line.
                    progress(0, None, f"waiting for the GPU {key}: {busy}{_in_line(len(ahead))}")
            time.sleep(_POLL_S)


def _busy(lane_file: LaneFile, ahead: list[LaneTicket]) -> str:
    """Whom a waiter waits for: the lane's holder as it recorded itself, else the first ticket ahead."""
    here = socket.gethostname()
    found = lane_file.holder()
    if found is not None:
        return found.describe(here)
    if ahead:
        first = ahead[0]
        where = f"pid {first.pid}" + (f" on {first.host}" if first.host != here else "")
        return f"{first.what} ({where}, first in line, since {_clock(first.since)})"
    return "a process that left no record"


def _in_line(ahead: int) -> str:
    """A waiter's place, in words (`ahead` counts the holder's ticket too)."""
    return f" [place {ahead + 1} in line: {ahead} ahead]" if ahead else ""


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
    return _LANE.mine()


def holder() -> str:
    """What holds the lane in this process now ('' when no thread of it does)."""
    now = _LANE.hold
    return now.what if now else ""


def _log_event(now: LaneHold, event: str, seconds: float, t: float) -> None:
    wall = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    log.info("gpu lane: %s %s %.3f s [gpu=%s scope=%s pid=%d place=%d ticket=%d t=%.6f wall=%s thread=%s]", now.what,
             event, seconds, now.gpu or "none", "machine" if now.machine else "process", os.getpid(), now.place,
             now.ticket, t, wall, threading.current_thread().name)


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
    r"\[gpu=(?P<gpu>\S+) scope=(?P<scope>\w+) pid=(?P<pid>\d+)(?: place=(?P<place>\d+) ticket=(?P<ticket>-?\d+))? "
    r"t=(?P<t>[\d.]+) wall=(?P<wall>\S+) "
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
    place: int = 0  # holds ahead of it in line as it arrived
    ticket: int = -1  # its number in the machine-wide line (-1: none)


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
                              end=float(m["t"]), place=int(entry["place"] or 0),
                              ticket=int(entry["ticket"] if entry["ticket"] is not None else -1)))
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
