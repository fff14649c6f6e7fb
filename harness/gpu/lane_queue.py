"""The GPU lane's line: first come, first served across every thread and process of the machine.

The lane's lock file (`harness.gpu.lane_file`) says who holds a GPU now; it says nothing about who came
first among those waiting, and a lock that waiters race for goes to whichever polls first. So each
waiter takes a ticket as it arrives, and only the waiter whose ticket is first in line tries the
lock. A ticket is a file in the lane folder, `<key>.t<number>`, numbered from the line's counter
(`<key>.next`) under the line's own mutex (`<key>.line.lock`, `filelock`): numbers only grow, so
the line is the tickets present, in their numbers' order.

A ticket stays in line exactly as long as its waiter lives: the waiter holds a `flock` on its
ticket file from before the ticket is in line (it is made under another name, locked, then renamed
into place) until it leaves, and the kernel releases that lock however the waiter ends. A ticket
whose file anyone can lock is therefore stale (its process died, or left it behind): whoever finds
it reaps it (removes the file). No process id is trusted, so a reused pid, another pid namespace
sharing the folder, or another host cannot keep a stale ticket alive or reap a live one.

A ticket holds a record of its waiter (`LaneTicket`: what, pid, host, since), which the waiters
behind it read to say whom they wait for; another user may have written it, so it is a claim to
show, never a fact to act on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import uuid
from pathlib import Path

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

__all__ = ["LaneLine", "LaneTicket", "Ticket"]

_SHARED_FILE = 0o666  # every user's kb-mcp takes tickets in one line
_RECORD_BYTES = 1024
_MUTEX_S = 30.0  # the line's mutex is held for microseconds; longer means a hung holder of it


class LaneTicket(BaseModel):
    """A waiter's record in its ticket: who waits, and for what."""

    model_config = ConfigDict(extra="ignore")

    what: str
    pid: int
    host: str
    thread: str = ""
    since: float  # wall clock at arrival

    @field_validator("what", "host", "thread")
    @classmethod
    def _printable(cls, text: str) -> str:
        # Another user may have written it: no control characters, no essays.
        return "".join(c if c.isprintable() else "?" for c in text)[:160]


class Ticket:
    """One waiter's place in the line: its number and the locked descriptor of its ticket file."""

    def __init__(self, number: int, path: Path, fd: int, record: LaneTicket) -> None:
        self.number = number
        self.path = path
        self.fd: int | None = fd
        self.record = record


class LaneLine:
    """The line of one GPU's lane in `folder` (see the module docstring)."""

    def __init__(self, folder: Path, key: str) -> None:
        self.folder = folder
        self.key = key
        self._counter = folder / f"{key}.next"
        self._mutex = FileLock(str(folder / f"{key}.line.lock"), timeout=_MUTEX_S, mode=_SHARED_FILE)
        self._name = re.compile(rf"^{re.escape(key)}\.t(\d{{12}})$")

    def join(self, record: LaneTicket) -> Ticket:
        """Takes the next ticket: the caller is in line (behind every ticket taken before) until `leave`."""
        temp = self.folder / f".{self.key}.{uuid.uuid4().hex}.new"
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _SHARED_FILE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a new file nobody else has opened: at once
            data = json.dumps(record.model_dump()).encode()[:_RECORD_BYTES]
            os.pwrite(fd, data, 0)
            with self._mutex:
                number = max(self._read_counter(), self._last_number() + 1)
                path = self.folder / f"{self.key}.t{number:012d}"
                os.rename(temp, path)  # in line, already locked: nobody can take it for stale
                self._write_counter(number + 1)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        return Ticket(number, path, fd, record)

    def ahead(self, ticket: Ticket) -> list[LaneTicket]:
        """The live tickets before `ticket`, first in line first (stale ones are reaped on the way)."""
        found = []
        for number, path in self._tickets():
            if number >= ticket.number:
                break
            record = self._alive(path)
            if record is not None:
                found.append(record)
        return found

    def leave(self, ticket: Ticket) -> None:
        """Takes the ticket out of line (its file removed, its lock released)."""
        with contextlib.suppress(OSError):
            os.unlink(ticket.path)
        fd, ticket.fd = ticket.fd, None
        if fd is not None:
            os.close(fd)

    # -- the files ------------------------------------------------------------------------------

    def _tickets(self) -> list[tuple[int, Path]]:
        out = []
        for name in os.listdir(self.folder):
            m = self._name.match(name)
            if m:
                out.append((int(m[1]), self.folder / name))
        return sorted(out)

    def _last_number(self) -> int:
        tickets = self._tickets()
        return tickets[-1][0] if tickets else -1

    def _read_counter(self) -> int:
        try:
            return int(self._counter.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0  # missing or garbled: the tickets present say where the line is (`_last_number`)

    def _write_counter(self, value: int) -> None:
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self._counter, flags)
        except FileNotFoundError:
            fd = os.open(self._counter, flags | os.O_CREAT | os.O_EXCL, _SHARED_FILE)
            with contextlib.suppress(OSError):
                os.fchmod(fd, _SHARED_FILE)  # the umask must not narrow it
        except OSError:
            return  # another user's counter we may not write: the tickets present keep the order
        try:
            data = str(value).encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def _alive(self, path: Path) -> LaneTicket | None:
        """The ticket's record if its waiter still holds it (a record that cannot be read counts as
        an unnamed waiter); None, and the file reaped, when nobody does."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None  # left meanwhile
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_record(fd)
            with contextlib.suppress(OSError):  # stale: its waiter is gone
                os.unlink(path)
            return None
        finally:
            os.close(fd)


def _read_record(fd: int) -> LaneTicket:
    try:
        return LaneTicket.model_validate(json.loads(os.pread(fd, _RECORD_BYTES + 1, 0)))
    except (OSError, ValueError, ValidationError):
        return LaneTicket(what="a waiter that left no readable record", pid=0, host="", since=0.0)
