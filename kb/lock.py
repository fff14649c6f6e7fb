"""The KB's cross-process lock: an OS file lock (`filelock`) that names its holder and notices when
its file was deleted.

With an OS lock (flock) a lock is never stale: the kernel releases it when its holder exits, however
it exits. So a timeout means a live process holds it, and the message names that process (pid,
host, command, since when, from the holder file written beside the lock) and says to stop it, never
to delete the lock file: deleting it lets the next writer lock a new file while the holder still
writes. The holder checks before every write that the lock file it locked is still the one at the
path (`assert_held`), and refuses to write when it is not.

That check alone leaves a window: a lock file deleted just after it passed lets a second writer in
while the first still writes, and a journal line the second acknowledged could be dropped by the
first's compaction (which empties the journal). So each write (`writing`: one journal append, or a
compaction from its check of the journal to emptying it) also holds a short `flock` on the KB's
folder, which no one deletes while the KB is in it, and makes its check inside: writes never
interleave, and only the holder of the lock file now at the path writes at all.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import filelock

from kb_mcp.kb import settings
from kb_mcp.kb.errors import KBConflictError, KBLockTimeout, storage_error
from kb_mcp.kb.owners import process_alive

ENV_LOCK_TIMEOUT = "KB_MCP_LOCK_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
_HOLDER_BYTES = 512  # the holder record, padded: every write covers the last one whole
_GATE_POLL_S = 0.002  # between tries of the folder's flock (held for one write: milliseconds)


def default_timeout() -> float:
    """Seconds a writer waits for the KB lock (``KB_MCP_LOCK_TIMEOUT``, default 60); SettingError
    for a value that is not a number of seconds."""
    return settings.seconds(ENV_LOCK_TIMEOUT, DEFAULT_TIMEOUT_S)


class KBLock:
    """One process's handle on the lock of one KB file (re-entrant within the process's threads is
    the store's job: it holds its own mutex around every use)."""

    def __init__(self, kb_path: Path, timeout: float | None = None, mode: int = 0o600) -> None:
        self.kb_path = kb_path
        self.path = kb_path.with_name(kb_path.name + ".lock")
        self.holder_path = kb_path.with_name(kb_path.name + ".lock.holder")
        self.timeout = default_timeout() if timeout is None else timeout
        self._lock = filelock.FileLock(str(self.path), timeout=self.timeout, mode=(mode & 0o666) | 0o600)
        self._mode = (mode & 0o666) | 0o600
        self._holder_fd: int | None = None
        self._holder_pid = 0
        self._holder_head = b""  # the holder record up to its time (set per process: see _record_holder)
        self._held = threading.local()  # the (dev, inode) this thread locked, per thread like filelock's own state
        self._command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv[:3]))[:120]

    @contextlib.contextmanager
    def held(self, timeout: float | None = None) -> Iterator[None]:
        """Holds the lock for the block; KBLockTimeout names the holder when it stays busy."""
        wait = self.timeout if timeout is None else timeout
        started = time.monotonic()
        try:
            self._lock.acquire(timeout=wait)
        except filelock.Timeout:
            raise self.timeout_error(time.monotonic() - started) from None
        except OSError as exc:
            raise storage_error(exc, "take the KB lock", self.path) from exc
        try:
            self._held.identity = self._fd_identity()
            self._record_holder()
            yield
        finally:
            self._held.identity = None
            self._lock.release()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Holds the KB folder's write gate for one write and checks inside it that the lock is still
        this process's (`assert_held`). Callers hold the lock (`held`); KBLockTimeout if the gate stays
        busy as long as the lock's timeout, KBConflictError if the lock file was deleted or replaced."""
        gate = self._take_gate()
        try:
            self.assert_held()
            yield
        finally:
            if gate is not None:
                os.close(gate)  # releases the flock

    def _take_gate(self) -> int | None:
        """The flocked descriptor of the KB's folder; None where the folder cannot be opened or flocked
        (e.g. NFS refuses an exclusive flock on a read-only descriptor): the lock and the journal's own
        checks then stand alone, as they did before the gate."""
        try:
            fd = os.open(self.kb_path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return None
        started = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    return None
            if time.monotonic() - started > self.timeout:
                os.close(fd)
                raise self.timeout_error(time.monotonic() - started)
            time.sleep(_GATE_POLL_S)

    def assert_held(self) -> None:
        """Raises KBConflictError unless the lock file at the path is still the one this process locked."""
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == getattr(self._held, "identity", None)
        except FileNotFoundError:
            same = False
        if not same:
            raise KBConflictError(
                f"{self.kb_path}: the lock file {self.path} was deleted or replaced while this process held it, "
                "so another process may be writing the KB at the same time. Nothing was written by this transaction",
                where=self.path,
                action="call again (the lock is taken anew); never delete the lock file of a KB in use",
            )

    def _fd_identity(self) -> tuple[int, int] | None:
        fd = getattr(getattr(self._lock, "_context", None), "lock_file_fd", None)
        try:
            st = os.fstat(fd) if isinstance(fd, int) else os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def _record_holder(self) -> None:
        """Writes who holds the lock (best effort: a holder that cannot record itself still holds it).

        One fixed-size `pwrite` into a file kept open: a rename per transaction would cost a
        directory update on every commit.
        """
        try:
            fd = self._holder_fd
            if fd is None or self._holder_pid != os.getpid() or os.fstat(fd).st_nlink == 0:  # first, forked, deleted
                if fd is not None:
                    os.close(fd)
                self._holder_fd = None
                fd = self._holder_fd = os.open(self.holder_path, os.O_RDWR | os.O_CREAT, self._mode)
                self._holder_pid = os.getpid()
                who = {"pid": self._holder_pid, "host": socket.gethostname(), "command": self._command}
                self._holder_head = json.dumps(who).encode()[:-1] + b", "
            record = self._holder_head + b'"since": %.3f}' % time.time()
            os.pwrite(fd, record[:_HOLDER_BYTES].ljust(_HOLDER_BYTES), 0)  # JSON ignores the padding
        except OSError:
            pass

    def probe(self) -> str:
        """'free', or who holds the lock now (it is taken for an instant to tell, never recorded)."""
        probe = filelock.FileLock(str(self.path), timeout=0)
        try:
            probe.acquire(timeout=0)
        except filelock.Timeout:
            return f"held by {self.describe_holder()}"
        except OSError as exc:
            return f"cannot be checked: {exc.strerror or exc}"
        probe.release()
        return "free"

    def holder(self) -> dict[str, Any] | None:
        """What the current (or last) holder recorded about itself, or None."""
        try:
            info = json.loads(self.holder_path.read_bytes())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def describe_holder(self) -> str:
        """The holder in words: pid, host, command, since when, and whether it still runs."""
        info = self.holder()
        if info is None:
            return "the holder did not record itself (a kb-mcp older than this one, or another program)"
        pid, host = info.get("pid"), info.get("host")
        since = info.get("since")
        when = ""
        if isinstance(since, (int, float)):
            stamp = datetime.fromtimestamp(since, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            when = f" since {stamp} ({_ago(time.time() - since)} ago)"
        who = f"pid {pid} on host {host}" + (f" (`{info.get('command')}`)" if info.get("command") else "") + when
        if host == socket.gethostname() and isinstance(pid, int) and not process_alive(pid):
            return f"{who} recorded itself last but has exited; the holder now is unknown"
        return who

    def timeout_error(self, waited_s: float) -> KBLockTimeout:
        """The error for a writer that waited `waited_s` in vain."""
        info = self.holder()
        pid = info.get("pid") if info else None
        here = info is not None and info.get("host") == socket.gethostname()
        stop = f"If that process is hung, stop it (e.g. `kill {pid}`)" if here and isinstance(pid, int) else \
            "If the holding process is hung, stop it"
        return KBLockTimeout(
            f"{self.kb_path}: waited {waited_s:.0f} s for the KB lock {self.path}, held by {self.describe_holder()}",
            where=self.path,
            action=f"{stop}: the operating system releases its lock when it exits, and nothing it committed is lost. "
            f"Do not delete the lock file: that lets two writers in at once. Waiting longer: set {ENV_LOCK_TIMEOUT} "
            "(seconds)",
        )


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
