"""Waiting for a process the sandbox started (server side): its time limit, its whole group killed
at it or at an interrupted wait, and what it prints kept within a bound.

A sandboxed process runs code we do not trust (a problem traced, a candidate profiled, a compiler on
a candidate's source), and what it prints comes back through a pipe. Read whole, a process printing
without end grows the server's memory until the process's time limit, or until the machine runs out:
3 GB printed by a problem's constructor took a decomposition's server process to 9 GB. `BoundedText`
keeps the first and the last `OUTPUT_LIMIT_CHARS // 2` characters (where a failure's own words are:
a traceback at the end, a tool's refusal at the start) and counts what it leaves out between them;
`drain` reads a stream into it a bounded piece at a time, so not even one line without an end is
held whole. `wait_for` (and `finish`, its plain form) waits with both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["OUTPUT_LIMIT_CHARS", "PIECE_CHARS", "BoundedText", "Ended", "drain", "finish", "kill_group", "wait_for"]

OUTPUT_LIMIT_CHARS = 1 << 20
"""The most output kept of one process: its first and last half MiB of characters."""
PIECE_CHARS = 1 << 16
"""The most read from a stream at once (a line longer than this comes in several pieces)."""


class BoundedText:
    """Text added piece by piece, of which the first and the last `limit // 2` characters are kept;
    `text` puts one line saying how many characters were left out where they were."""

    def __init__(self, limit: int = OUTPUT_LIMIT_CHARS) -> None:
        self._half = max(1, limit // 2)
        self._head: list[str] = []
        self._head_chars = 0
        self._tail: deque[str] = deque()
        self._tail_chars = 0
        self.dropped = 0  # characters left out between the head and the tail

    def add(self, piece: str) -> None:
        """Adds `piece` (any length) after what came before."""
        room = self._half - self._head_chars
        if room > 0:
            self._head.append(piece[:room])
            self._head_chars += min(room, len(piece))
            piece = piece[room:]
        if not piece:
            return
        self._tail.append(piece)
        self._tail_chars += len(piece)
        while self._tail_chars - len(self._tail[0]) >= self._half:  # whole pieces the tail no longer needs
            self.dropped += len(self._tail[0])
            self._tail_chars -= len(self._tail.popleft())

    @property
    def text(self) -> str:
        """What was kept: the head, the count of what was left out (if anything), the tail."""
        tail = "".join(self._tail)
        cut = max(0, len(tail) - self._half)
        head = "".join(self._head)
        if not self.dropped and not cut:
            return head + tail
        return f"{head}\n[... {self.dropped + cut} characters of output left out ...]\n{tail[cut:]}"


def drain(stream: IO[str], into: BoundedText, on_piece: Callable[[str], None] | None = None) -> None:
    """Reads `stream` to its end into `into`, at most `PIECE_CHARS` at a time (each piece a line or a
    part of one), each piece also given to `on_piece` (progress read from the output)."""
    while True:
        piece = stream.readline(PIECE_CHARS)
        if not piece:
            return
        into.add(piece)
        if on_piece is not None:
            on_piece(piece)


@dataclass(frozen=True)
class Ended:
    """How a process `Sandbox.popen` started with piped text output ended (`wait_for`)."""

    code: int  # its return code; -9 where it was killed at its time limit
    output: str  # what it printed, within `OUTPUT_LIMIT_CHARS` (its first and last characters)
    timed_out: bool  # killed at its time limit


POLL_S = 1.0  # how often `wait_for` asks its `restart` whether the time limit starts again


def finish(proc: subprocess.Popen[str], timeout_s: float, input_text: str | None = None) -> tuple[int, str]:
    """`wait_for` as (return code, output), the time limit's end said at the end of the output."""
    ended = wait_for(proc, timeout_s, input_text)
    return ended.code, ended.output


def wait_for(proc: subprocess.Popen[str], timeout_s: float, input_text: str | None = None,
             restart: Callable[[], bool] | None = None) -> Ended:
    """Waits for a process `Sandbox.popen` started with piped text output. At `timeout_s` its group
    is killed (-9, said at the end of the output); so it is when the wait is interrupted (Ctrl-C, a
    cancelled call), so that nothing it started outlives the caller's wait. `restart`, asked about
    every `POLL_S` while it runs, starts the time limit again where it answers True (the process
    finished one of several pieces of work, each with the whole limit). Its output is read as it
    comes and kept within `OUTPUT_LIMIT_CHARS`: what an untrusted process prints never grows
    the caller's memory past that."""
    kept = BoundedText()
    reader = threading.Thread(target=drain, args=(proc.stdout, kept), daemon=True) if proc.stdout else None
    feeder = None if proc.stdin is None else threading.Thread(target=_feed, args=(proc.stdin, input_text or ""),
                                                              daemon=True)
    started = [t for t in (reader, feeder) if t is not None]
    for thread in started:
        thread.start()
    try:
        deadline = _wait_restarting(proc, timeout_s, restart)
        if reader is not None:
            reader.join(max(0.0, deadline - time.monotonic()))
            if reader.is_alive():  # the process ended, but what it started still writes to its output
                raise subprocess.TimeoutExpired(proc.args, timeout_s)
        return Ended(proc.returncode, kept.text, timed_out=False)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.wait()
        for thread in started:
            thread.join(5.0)
        return Ended(-9, kept.text + f"\n[killed after {timeout_s:.0f} s]", timed_out=True)
    except BaseException:
        kill_group(proc)
        raise


def _wait_restarting(proc: subprocess.Popen[str], timeout_s: float, restart: Callable[[], bool] | None) -> float:
    """Waits for `proc` to end, the limit started again where `restart` says; returns the deadline
    it ended within, or raises TimeoutExpired."""
    deadline = time.monotonic() + timeout_s
    while True:
        step = deadline - time.monotonic() if restart is None else min(POLL_S, deadline - time.monotonic())
        try:
            proc.wait(timeout=max(0.0, step))
            return deadline
        except subprocess.TimeoutExpired:
            if restart is not None and restart():
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() >= deadline:
                raise


def _feed(stdin: Any, text: str) -> None:
    """Writes `text` to a process's standard input and closes it (a process that stops reading, or
    ends, leaves the rest unwritten)."""
    try:
        stdin.write(text)
        stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """Kills a process started by `Sandbox.popen` and everything in its session."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
