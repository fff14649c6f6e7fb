"""The machine-wide part of the GPU lane: one lock file per GPU key in a folder every user's
kb-mcp can use, locked with `flock` and holding a record of its holder.

Why `flock` on a file: the kernel releases the lock when its holder's last descriptor closes,
however the holder ends (SIGKILL included), so a lane is never left locked by a dead process and
no lock file ever needs deleting. The descriptor is opened close-on-exec, so no worker or compiler
started under the lane inherits it (a child that outlived a killed server would otherwise keep
its lane locked).

The folder (`lane_dir`): `/tmp/kb-mcp-gpu-lanes`, not `$TMPDIR` (which may be private to a
user), made world-writable and sticky like `/tmp` itself, so that each user's files there can be
neither deleted nor replaced by another; `KB_MCP_LANE_DIR` names another one (processes take turns
only where they name the same folder). A lock file is opened without `O_CREAT` when it exists
(Linux's `fs.protected_regular` refuses `O_CREAT` on another user's file in a sticky folder),
never through a symbolic link, and made read-write for everyone when created, so any user's
process can lock it and write its record; one that cannot write it still locks it, unrecorded.

A waiter holds the lane's door (a second lock file) while it waits, so a holder that leaves and
comes straight back queues behind it (`LaneFile`): no process can keep a GPU to itself by holding
the lane back to back.

The record (`LaneHolder`): who holds the lane (pid, host, user, command), what it runs and since
when, written into the lock file by its holder and emptied as it leaves. Another user may write
that file too, so a reader takes the record as a claim to show, never as a fact to act on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from kb_mcp.kb.owners import process_alive

__all__ = ["DEFAULT_DIR", "ENV_LANE_DIR", "LaneFile", "LaneHolder", "LaneUnavailable", "lane_dir"]

ENV_LANE_DIR = "KB_MCP_LANE_DIR"
DEFAULT_DIR = Path("/tmp/kb-mcp-gpu-lanes")
_SHARED_MODE = 0o1777  # like /tmp: everyone may add files, only a file's owner may remove or rename it
_RECORD_BYTES = 1024  # a record is read whole or not at all (see LaneFile.holder)


class LaneUnavailable(OSError):
    """The machine-wide lane cannot be used here (the message says why and what to change)."""


class LaneHolder(BaseModel):
    """Who holds a GPU's lane, as its holder recorded it."""

    model_config = ConfigDict(extra="ignore")

    gpu: str
    what: str  # what it runs: a tool's name, or the harness request ("verify relu")
    pid: int
    host: str
    user: str = ""
    command: str = ""
    since: float  # wall-clock seconds since the epoch

    @field_validator("gpu", "what", "host", "user", "command")
    @classmethod
    def _printable(cls, text: str) -> str:
        # Another user may have written the record: no control characters, no essays.
        return "".join(c if c.isprintable() else "?" for c in text)[:160]

    def describe(self, here: str) -> str:
        """The holder in words for a waiter on host `here`: what, pid, command, since when."""
        stamp = datetime.fromtimestamp(self.since, timezone.utc).strftime("%H:%M:%S UTC")
        ago = max(0, int(time.time() - self.since))
        where = f"pid {self.pid}" + (f" on {self.host}" if self.host != here else "")
        who = f", user {self.user}" if self.user else ""
        text = f"{self.what} (`{self.command}`, {where}{who}, since {stamp}, {ago} s ago)"
        if self.host == here and not process_alive(self.pid):
            text += " [that process has exited: whoever holds the lock now did not record itself]"
        return text


def lane_dir() -> Path:
    """The folder of the lock files, made (sticky, world-writable) where missing; LaneUnavailable
    when it cannot serve every user."""
    given = os.environ.get(ENV_LANE_DIR, "").strip()
    path = Path(given) if given else DEFAULT_DIR
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, _SHARED_MODE)  # the umask must not narrow it
    except FileExistsError:
        pass
    except OSError as exc:
        raise LaneUnavailable(exc.errno, f"cannot make the GPU lane folder {path}: {exc.strerror}; "
                              f"set {ENV_LANE_DIR} to a folder every kb-mcp of this machine can write") from exc
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise LaneUnavailable(errno.ENOTDIR, f"the GPU lane folder {path} is not a folder (a link or a file): "
                              f"remove it, or set {ENV_LANE_DIR}")
    if st.st_uid == os.getuid():
        if not given and stat.S_IMODE(st.st_mode) != _SHARED_MODE:
            os.chmod(path, _SHARED_MODE)  # ours: made shared again (another user's kb-mcp needs it)
        return path
    shared = stat.S_IMODE(st.st_mode) & _SHARED_MODE == _SHARED_MODE
    if not (shared or st.st_uid == 0) or not os.access(path, os.W_OK | os.X_OK):
        raise LaneUnavailable(errno.EACCES, f"the GPU lane folder {path} belongs to uid {st.st_uid} with mode "
                              f"{stat.S_IMODE(st.st_mode):o}, which this user (uid {os.getuid()}) cannot share; its "
                              f"owner can `chmod 1777 {path}`, or set {ENV_LANE_DIR} for every kb-mcp of this machine")
    return path


class _Flock:
    """One lock file of the lane folder and this process's descriptor on it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.writable = False

    def try_lock(self) -> bool:
        """Takes the lock if it is free now (never waits)."""
        if self.fd is None:
            self.fd, self.writable = self._open()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if self._same_file():
            return True
        self.close()  # replaced at the path between our open and our lock: lock what is there now
        return False

    def _open(self) -> tuple[int, bool]:
        flags = os.O_NOFOLLOW | os.O_CLOEXEC
        while True:
            try:
                return os.open(self.path, os.O_RDWR | flags), True
            except PermissionError:
                try:  # another user's file that we may not write: flock needs only a descriptor
                    return os.open(self.path, os.O_RDONLY | flags), False
                except OSError as exc:
                    raise self._unavailable(exc) from exc
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise self._unavailable(exc) from exc
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o666)
            except FileExistsError:
                continue  # another process made it first: open that one
            except OSError as exc:
                raise self._unavailable(exc) from exc
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o666)  # every user's kb-mcp locks and records in it; the umask must not narrow it
            return fd, True

    def _unavailable(self, exc: OSError) -> LaneUnavailable:
        return LaneUnavailable(exc.errno or errno.EIO, f"cannot open the GPU lane's lock file {self.path}: "
                               f"{exc.strerror or exc}; set {ENV_LANE_DIR} to a folder every kb-mcp of this "
                               "machine can write")

    def _same_file(self) -> bool:
        assert self.fd is not None
        try:
            a, b = os.fstat(self.fd), os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    def close(self) -> None:
        """Closes the descriptor (which releases a lock it holds)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class LaneFile:
    """One GPU's lane, as one process uses it for one hold: `try_lock` until it is taken, `record`,
    `unlock`.

    Two lock files: the lane (`<key>.lock`, which its holder holds and records itself in) and its
    door (`<key>.door`), which a waiter holds while it waits for the lane and lets go of once in.
    A holder that leaves and comes straight back must pass the door first, so the waiter standing
    there goes next: back-to-back holds of one process (an eval's verifications) cannot starve
    another process's waiter. Among several waiters the door goes to whichever polls first.
    """

    def __init__(self, folder: Path, key: str) -> None:
        self._lane = _Flock(folder / f"{key}.lock")
        self._door = _Flock(folder / f"{key}.door")
        self._at_door = False
        self.path = self._lane.path

    def try_lock(self) -> bool:
        """Takes the lane if it is free now and no other waiter stands at its door (never waits)."""
        if not self._at_door:
            if not self._door.try_lock():
                return False
            self._at_door = True
        if not self._lane.try_lock():
            return False
        self._door.close()  # in: the next waiter may step up
        self._at_door = False
        return True

    def record(self, holder: LaneHolder) -> None:
        """Writes the holder's record (best effort: a holder that cannot record itself still holds it)."""
        fd = self._lane.fd
        if fd is None or not self._lane.writable:
            return
        data = json.dumps(holder.model_dump()).encode()[:_RECORD_BYTES]
        with contextlib.suppress(OSError):
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))

    def unlock(self) -> None:
        """Empties the record and releases the lane."""
        if self._lane.fd is not None and self._lane.writable:
            with contextlib.suppress(OSError):
                os.ftruncate(self._lane.fd, 0)
        self.close()

    def close(self) -> None:
        """Lets go of the lane and the door, whichever this process holds."""
        self._lane.close()
        self._door.close()
        self._at_door = False

    def holder(self) -> LaneHolder | None:
        """The record of the holder now, None when there is none or it cannot be read (being rewritten)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.pread(fd, _RECORD_BYTES + 1, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            return LaneHolder.model_validate(json.loads(data))
        except (ValueError, ValidationError):
            return None
