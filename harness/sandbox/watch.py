"""Watching a sandboxed process from outside it: seccomp user notification, answered by the server.

`harness.sandbox.sandbox` starts every confined process through `harness/sandbox/watch_launch.py`, which installs a
seccomp filter sending a few system calls to a listener and hands that listener to the server
before the untrusted command starts. A `Watch` (one thread per sandboxed process tree) receives
each watched call, reads what it names from the process's memory (`/proc/PID/mem`: a path, an
address, a program's arguments), records it when it is an attempt, and answers:

* the calls the sandbox refuses (`sandbox.DENIED_SYSCALLS`), a filter of the process's own
  (`seccomp`, `prctl(PR_SET_SECCOMP)`) and `prctl(PR_SET_DUMPABLE)` (which would hide its memory
  from this reader): refused with EPERM, recorded;
* everything else (`execve`, `connect`, `sendto` to an address, opening a file): allowed to go on
  (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`); the kernel and the mount view decide what it reaches, as
  without the watch. Only an attempt is recorded: a program outside `attempts.program_allowed`,
  any IP connection or datagram (the network namespace has nothing to reach), a write outside the
  writable places (scratch, the private /tmp, /dev/shm, /dev), a read of a private place (the KB,
  the cache, home folders, the server's working folder).

The candidate cannot reach the record: the listener lives only in the server (the launcher closes
its copy before the command runs), the thread is outside the sandbox's pid namespace, and the
record never passes through the candidate's output or channel. What it can do is fail to leave
one: a thread that rewrites a path between the call and this read changes what is recorded (not
what the kernel allows); a 32-bit system call is killed by the filter, unrecorded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import functools
import json
import os
import select
import socket
import struct
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb_mcp.harness.sandbox.attempts import (
    Attempt,
    AttemptLog,
    active_logs,
    announce,
    clients_of,
    in_writable_place,
    program_allowed,
    toolchain_script,
    where,
)
from kb_mcp.kb import settings

ENV_WATCH = "KB_MCP_WATCH"  # off (or 0/false/no): start sandboxed processes without the watch (no record)
LAUNCHER = Path(__file__).with_name("watch_launch.py")

_NOTIF_SIZE = 80  # struct seccomp_notif: id u64, pid u32, flags u32, seccomp_data (nr, arch, ip, args[6])
_RESP_SIZE = 24  # struct seccomp_notif_resp: id u64, val s64, error s32, flags u32
IOCTL_RECV = 0xC0502100  # _IOWR('!', 0, struct seccomp_notif)
IOCTL_SEND = 0xC0182101  # _IOWR('!', 1, struct seccomp_notif_resp)
FLAG_CONTINUE = 1
O_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
PR_SET_DUMPABLE, PR_SET_SECCOMP = 4, 22
AT_FDCWD = -100
AF_INET, AF_INET6 = 2, 10
CMP_EQ, CMP_NE, CMP_MASKED_EQ = 4, 1, 7

# Watched calls, with libseccomp argument comparisons (none: every call; several rules of one call:
# any of them). Opening a file is watched for writing only (the flags are compared in the filter,
# so reads never leave the kernel), except in the roles that run candidate Python (`READ_ROLES`),
# where a read of a private place is an attempt too: each open there costs a round trip to the
# server (tens of microseconds; docs/harness.md has the figures).
_WRITE_BITS = (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND)
READ_ROLES = frozenset({"worker", "driver"})
OPENS_ANY: tuple[tuple[str, list[list[int]]], ...] = (("open", []), ("openat", []))
OPENS_FOR_WRITING: tuple[tuple[str, list[list[int]]], ...] = tuple(
    (name, [[arg, CMP_MASKED_EQ, bit, bit]]) for name, arg in (("open", 1), ("openat", 2)) for bit in _WRITE_BITS)
WATCHED: tuple[tuple[str, list[list[int]]], ...] = (
    ("execve", []), ("execveat", []), ("connect", []), ("sendto", [[4, CMP_NE, 0, 0]]),
    ("openat2", []), ("creat", []),
    ("unlink", []), ("unlinkat", []), ("rename", []), ("renameat", []), ("renameat2", []),
    ("mkdir", []), ("mkdirat", []), ("rmdir", []), ("truncate", []), ("symlink", []), ("symlinkat", []),
    ("link", []), ("linkat", []),
    ("seccomp", []), ("prctl", [[0, CMP_EQ, PR_SET_SECCOMP, 0]]), ("prctl", [[0, CMP_EQ, PR_SET_DUMPABLE, 0]]),
)
# Calls refused whatever they name (besides sandbox.DENIED_SYSCALLS): the process's own filter, and
# making its memory unreadable to the watch.
REFUSED_ALWAYS = ("seccomp", "prctl")


@functools.lru_cache(maxsize=1)
def _libseccomp() -> Any:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    lib = ctypes.CDLL(name)
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    return lib


@functools.lru_cache(maxsize=1)
def _numbers(names: tuple[str, ...]) -> dict[int, str]:
    lib = _libseccomp()
    out = {}
    for name in names:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr >= 0:
            out[nr] = name
    return out


def watch_enabled() -> bool:
    """False when $KB_MCP_WATCH is off (0/false/no/off), True when unset or on; any other value is refused
    by name (`kb.errors.SettingError`): a watch meant off, misspelt, must not silently stay on, nor the reverse."""
    return settings.switch(ENV_WATCH, True)


def unavailable() -> str:
    """Why attempts cannot be recorded on this machine ("" where they can): the watch's needs are
    Linux, libseccomp, and a kernel with seccomp user notification (5.5+ for CONTINUE)."""
    if not watch_enabled():
        return f"{ENV_WATCH}=off"
    if not sys.platform.startswith("linux"):
        return f"seccomp user notification needs Linux (this is {sys.platform})"
    try:
        _libseccomp()
    except OSError as exc:
        return f"libseccomp cannot be loaded ({exc})"
    release = os.uname().release.split("-")[0].split(".")
    try:
        major, minor = int(release[0]), int(release[1])
    except (ValueError, IndexError):
        return ""
    if (major, minor) < (5, 5):
        return f"kernel {os.uname().release} predates seccomp user notification with CONTINUE (5.5)"
    return ""


@dataclass(frozen=True)
class Places:
    """Where the watched process may write, what counts as private, and the toolchain's folders."""

    role: str
    writable: tuple[str, ...]  # scratch, /tmp, /var/tmp, /dev (its /dev/shm too), /proc (its own)
    readable: tuple[str, ...]  # the read-only view: reading there is never an attempt
    private: tuple[str, ...]  # the KB's home, the cache, home folders, the server's working folder
    tool_roots: tuple[str, ...]  # install folders whose programs may run (the CUDA toolkit, ncu)

    @staticmethod
    def of(role: str, scratch: Path, readable: Sequence[Path], private: Sequence[Path],
           tool_roots: Sequence[Path]) -> Places:
        """The places of one sandboxed process: its scratch and the sandbox's private folders
        writable; the read-only view readable; the server's private places and home folders private."""
        writable = (str(scratch), "/tmp", "/var/tmp", "/dev", "/proc")  # its scratch first
        # A private place holding the scratch or a writable place (a server started in /tmp) would
        # make every honest write an attempt: such a place is left out.
        hidden = [p for p in (*private, Path("/root"), Path("/home"))
                  if not any(_inside(w, str(p)) for w in writable)]
        return Places(role=role, writable=writable, readable=tuple(str(p) for p in readable),
                      private=tuple(str(p) for p in hidden),
                      tool_roots=tuple(str(r) for r in tool_roots))


class _Target:
    """Reading one notification's arguments from the calling process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._mem: int | None = None

    def close(self) -> None:
        if self._mem is not None:
            os.close(self._mem)

    def exists(self, path: str) -> bool | None:
        """Whether `path` names something in the calling process's own view of the files (its root,
        the sandbox's mounts); None where that view cannot be read."""
        if not path.startswith("/"):
            return None
        try:
            return os.path.lexists(f"/proc/{self.pid}/root{path}")
        except OSError:
            return None

    def runs_toolchain_script(self, roots: tuple[str, ...]) -> bool:
        """Whether the calling process is a shell running a script of the toolchain (`roots`)."""
        try:
            exe = os.readlink(f"/proc/{self.pid}/exe")
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                cmdline = f.read(4096).decode("utf-8", "replace").split("\0")
        except OSError:
            return False
        return toolchain_script(exe, cmdline, roots)

    def read(self, addr: int, size: int) -> bytes:
        if self._mem is None:
            self._mem = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(self._mem, size, addr)

    def string(self, addr: int, limit: int = 4096) -> str:
        """The NUL-terminated string at `addr` (read page by page: the next page may be unmapped)."""
        if not addr:
            return ""
        out = b""
        while len(out) < limit:
            chunk = 4096 - (addr + len(out)) % 4096
            try:
                data = self.read(addr + len(out), chunk)
            except OSError:
                break
            end = data.find(b"\0")
            if end >= 0:
                return (out + data[:end]).decode("utf-8", "replace")
            if not data:
                break
            out += data
        return out.decode("utf-8", "replace")

    def argv(self, addr: int, most: int = 12) -> list[str]:
        args = []
        for i in range(most):
            try:
                ptr = struct.unpack("<Q", self.read(addr + 8 * i, 8))[0]
            except (OSError, struct.error):
                break
            if not ptr:
                break
            args.append(self.string(ptr, 256))
        return args

    def path(self, dirfd: int, name: str) -> str:
        """`name` as the process names it, made absolute against its working folder or `dirfd`."""
        if name.startswith("/"):
            return os.path.normpath(name)
        base_link = f"/proc/{self.pid}/cwd" if dirfd in (AT_FDCWD, AT_FDCWD & 0xFFFFFFFF) \
            else f"/proc/{self.pid}/fd/{dirfd}"
        try:
            base = os.readlink(base_link)
        except OSError:
            base = "?"
        return os.path.normpath(os.path.join(base, name))


def _signed(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def _address(raw: bytes) -> str | None:
    """"1.1.1.1:443" / "[::1]:53" for an IP socket address; None for other families."""
    if len(raw) < 2:
        return None
    family = struct.unpack("<H", raw[:2])[0]
    if family == AF_INET and len(raw) >= 8:
        return f"{socket.inet_ntop(socket.AF_INET, raw[4:8])}:{struct.unpack('>H', raw[2:4])[0]}"
    if family == AF_INET6 and len(raw) >= 24:
        return f"[{socket.inet_ntop(socket.AF_INET6, raw[8:24])}]:{struct.unpack('>H', raw[2:4])[0]}"
    return None


class Watch:
    """The watch of one sandboxed process tree: receives its listener, then answers every watched
    call on a thread of its own until the last process of the tree has ended."""

    def __init__(self, places: Places, logs: Sequence[AttemptLog], denied: Sequence[str]) -> None:
        self.places = places
        self.logs: list[AttemptLog] = list(logs)
        self._lock = threading.Lock()
        self.denied = frozenset(denied) | frozenset(REFUSED_ALWAYS)
        self.numbers = _numbers(tuple(sorted({n for n, _ in WATCHED + OPENS_ANY} | self.denied)))
        self.attempts: list[Attempt] = []  # every attempt of the tree, for its whole life (capped)
        self.status = "starting"  # "recording", or "not recorded: why"
        self._launched = False  # the launcher's own exec of the command is not an attempt
        self._server, self.child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.child.set_inheritable(True)
        self.thread = threading.Thread(target=self._run, name="kb-mcp-sandbox-watch", daemon=True)

    def spec(self) -> str:
        """The launcher's SPEC argument (see harness/sandbox/watch_launch.py)."""
        opens = OPENS_ANY if self.places.role in READ_ROLES else OPENS_FOR_WRITING
        deny = sorted(self.denied - set(REFUSED_ALWAYS))
        return json.dumps({"notify": [[n, c] for n, c in WATCHED + opens], "deny": deny}, separators=(",", ":"))

    def prefix(self) -> list[str]:
        """The command line that runs the launcher before the command."""
        return [sys.executable, "-I", "-S", str(LAUNCHER), str(self.child.fileno()), self.spec(), "--"]

    def start(self, proc: Any) -> None:
        """Starts watching `proc` (just started: the child end is closed here); `watch_of(proc)` finds it."""
        self.child.close()
        self.thread.start()
        _WATCHES[proc] = self

    def abandon(self, why: str) -> None:
        """The process could not be started: nothing to watch."""
        self.child.close()
        self._server.close()
        self.status = f"not recorded: {why}"

    def follow(self, logbook: AttemptLog) -> None:
        """Reports this tree's attempts to `logbook` too, from now on (a warm worker's next request)."""
        with self._lock:
            if logbook not in self.logs:
                self.logs.append(logbook)
            if self.status.startswith("not recorded"):
                logbook.not_recorded(self.status.removeprefix("not recorded: "))

    def unfollow(self, logbook: AttemptLog) -> None:
        """Stops reporting to `logbook`."""
        with self._lock:
            if logbook in self.logs:
                self.logs.remove(logbook)

    # -- the thread ---------------------------------------------------------------------------

    def _receive(self) -> int | None:
        self._server.settimeout(120)
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self._server, 1024, 1)
        except OSError as exc:
            self._unrecorded(f"the launcher did not answer ({exc})")
            return None
        finally:
            self._server.close()
        if fds:
            return fds[0]
        text = msg.decode("utf-8", "replace")
        self._unrecorded(text.removeprefix("no:") if text else "the launcher ended before handing the listener over")
        return None

    def _unrecorded(self, why: str) -> None:
        with self._lock:
            self.status = f"not recorded: {why}"
            for logbook in self.logs:
                logbook.not_recorded(why)

    def _run(self) -> None:
        fd = self._receive()
        if fd is None:
            return
        self.status = "recording"
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        buf = bytearray(_NOTIF_SIZE)
        try:
            while True:
                events = poller.poll()
                if any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _fd, ev in events):
                    return  # every process of the tree has ended
                buf[:] = bytes(_NOTIF_SIZE)
                try:
                    fcntl.ioctl(fd, IOCTL_RECV, buf, True)
                except OSError as exc:
                    if exc.errno in (errno.ENOENT, errno.EINTR):  # the caller died meanwhile
                        continue
                    raise
                self._answer(fd, buf)
        except OSError as exc:  # pragma: no cover - the listener broke: what was recorded stays
            self._unrecorded(f"the listener failed ({exc})")
        finally:
            os.close(fd)

    def _answer(self, fd: int, buf: bytearray) -> None:
        nid, pid, _flags, nr, _arch, _ip = struct.unpack_from("<QIIiIQ", buf, 0)
        args = struct.unpack_from("<6Q", buf, 32)
        name = self.numbers.get(nr, f"syscall {nr}")
        target = _Target(pid)
        try:
            refusal, attempt = self._judge(name, args, target)
        except Exception:  # noqa: BLE001 - an unreadable call is let through, never left waiting
            refusal, attempt = 0, None
        finally:
            target.close()
        if attempt is not None:
            self._record(Attempt(kind=attempt[0], what=attempt[1], role=self.places.role))
        resp = struct.pack("<QqiI", nid, 0, -refusal, 0 if refusal else FLAG_CONTINUE)
        try:
            fcntl.ioctl(fd, IOCTL_SEND, bytearray(resp), True)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the caller died meanwhile
                raise

    def _record(self, attempt: Attempt) -> None:
        with self._lock:
            new = len(self.attempts) < 4 * 64 and attempt not in self.attempts
            if new:
                self.attempts.append(attempt)
            logs = list(self.logs)
        for logbook in logs:
            logbook.add(attempt)
        if new:  # told once per tree: a loop of attempts is one line of the server's log, not thousands
            announce(attempt, clients_of(logs))

    def _judge(self, name: str, a: tuple[int, ...], t: _Target) -> tuple[int, tuple[str, str] | None]:
        """(the errno to answer with, 0 to let the call go on; (kind, what) when it is an attempt)."""
        if name == "prctl":
            what = "prctl(PR_SET_SECCOMP): a seccomp filter of its own" if a[0] == PR_SET_SECCOMP \
                else "prctl(PR_SET_DUMPABLE): hiding its memory from the sandbox's watch"
            return errno.EPERM, ("tamper", what)
        if name == "seccomp":
            return errno.EPERM, ("tamper", "seccomp(): a seccomp filter of its own")
        if name in self.denied:
            return errno.EPERM, ("syscall", f"{name} (refused)")
        if name in ("execve", "execveat"):
            return self._exec(name, a, t)
        if name in ("connect", "sendto"):
            raw = t.read(a[1] if name == "connect" else a[4], min(128, a[2] if name == "connect" else a[5]))
            addr = _address(raw)
            return 0, ("network", f"{name} {addr}") if addr else None
        return 0, self._file(name, a, t)

    def _exec(self, name: str, a: tuple[int, ...], t: _Target) -> tuple[int, tuple[str, str] | None]:
        if name == "execve":
            path, argv = t.path(AT_FDCWD, t.string(a[0])), t.argv(a[1])
        else:
            path, argv = t.path(_signed(a[0]), t.string(a[1])), t.argv(a[2])
        with self._lock:
            first, self._launched = not self._launched, True
        if first:  # the launcher starting the command the server asked for
            return 0, None
        if t.exists(path) is False:
            # Nothing there to start: a search along PATH tries each folder in turn (nvcc looking for
            # gcc, subprocess for a program), and a folder of PATH may lie in a writable place. The
            # watch answers ENOENT itself, as the kernel would, so nothing created meanwhile can run
            # unrecorded, and it is no attempt.
            return errno.ENOENT, None
        if program_allowed(path, self.places.tool_roots, self.places.writable, self.places.readable):
            return 0, None
        if not in_writable_place(path, self.places.writable, self.places.readable) \
                and t.runs_toolchain_script(self.places.tool_roots):
            return 0, None  # a program of the system started by a script of the toolchain (ncu's wrapper)
        return 0, ("program", f"{name} {where(path)}" + (f": {' '.join(argv[1:])}" if len(argv) > 1 else ""))

    def _file(self, name: str, a: tuple[int, ...], t: _Target) -> tuple[str, str] | None:
        at_forms = {"openat": (0, 1), "openat2": (0, 1), "unlinkat": (0, 1), "renameat": (2, 3),
                    "renameat2": (2, 3), "mkdirat": (0, 1), "symlinkat": (1, 2), "linkat": (2, 3)}
        plain = {"open": 0, "creat": 0, "unlink": 0, "rename": 1, "mkdir": 0, "rmdir": 0, "truncate": 0,
                 "symlink": 1, "link": 1}
        if name in at_forms:
            d, p = at_forms[name]
            path = t.path(_signed(a[d]), t.string(a[p]))
        else:
            path = t.path(AT_FDCWD, t.string(a[plain[name]]))
        writing = True
        if name in ("open", "openat"):
            writing = bool(a[1 if name == "open" else 2] & O_WRITE)
        elif name == "openat2":
            writing = bool(struct.unpack("<Q", t.read(a[2], 8))[0] & O_WRITE)
        # A private place is one even where its path lies in a writable place of the sandbox (a KB
        # under /tmp, whose path inside is the sandbox's own empty /tmp).
        private = any(_inside(path, p) for p in self.places.private) and not _inside(path, self.places.writable[0]) \
            and not any(_inside(path, r) for r in self.places.readable)
        read_only = any(_inside(path, r) for r in self.places.readable)
        if writing and (private or read_only or not any(_inside(path, w) for w in self.places.writable)):
            verb = "open for writing" if name.startswith(("open", "creat")) else name
            return "write", f"{verb} {where(path)}"
        return ("read", f"open {where(path)}") if private and not writing else None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


_WATCHES: weakref.WeakKeyDictionary[Any, Watch] = weakref.WeakKeyDictionary()


def watch_of(proc: Any) -> Watch | None:
    """The watch of a process `Sandbox.popen` started (None: not watched)."""
    return _WATCHES.get(proc)


def follow_active(proc: Any) -> None:
    """Reports the attempts of `proc` (started before the work it now serves, e.g. a standby
    profiling driver) to the logs active now, for the rest of its life."""
    watch = _WATCHES.get(proc)
    for logbook in active_logs() if watch is not None else ():
        watch.follow(logbook)  # type: ignore[union-attr]
