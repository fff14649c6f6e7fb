"""The first program of every watched sandbox: installs the attempt filter, hands its listener out, runs the command.

Run by bubblewrap inside the sandbox (`python -I -S watch_launch.py SOCKET_FD SPEC -- COMMAND...`),
before any untrusted code: it is the server's own code, read from the read-only view, and imports
nothing but the standard library (`-I -S`: no site, no PYTHONPATH, nothing a candidate could have
placed). It builds a seccomp filter with libseccomp (ctypes) whose watched system calls go to a
user-notification listener, sends that listener's descriptor to the server over SOCKET_FD
(`SCM_RIGHTS`), closes both descriptors and execs COMMAND. From then on the filter holds for the
command and everything it starts, and only the server holds the listener: nothing inside can
answer, drop or forge a notification.

SPEC is JSON: {"notify": [[name, [[arg, op, a, b], ...]], ...], "deny": [name, ...]}: the watched
calls (with libseccomp argument comparisons, none: every call), and the calls refused outright when
no listener can be made here (the same refusals the server answers through the listener otherwise).
Where no listener can be made (an old kernel, a runtime without user notification), the refusals
are installed as plain EPERM and the server is told why, in one line instead of a descriptor.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import socket
import sys

ALLOW = 0x7FFF0000
NOTIFY = 0x7FC00000
ERRNO_EPERM = 0x00050000 | 1


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _libseccomp() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_notify_fd.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def _add(lib: ctypes.CDLL, ctx: int, action: int, name: str, cmps: list[list[int]]) -> None:
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr < 0:  # a call this architecture does not have (open, creat on aarch64)
        return
    arr = (_ArgCmp * max(1, len(cmps)))(*[_ArgCmp(*c) for c in cmps])
    rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr)
    if rc < 0:
        raise OSError(-rc, f"seccomp rule for {name}: {os.strerror(-rc)}")


def _install(spec: dict) -> int | str:
    """The listener's descriptor, or why there is none (after installing the plain refusals)."""
    try:
        lib = _libseccomp()
    except OSError as exc:
        return f"libseccomp cannot be loaded ({exc})"
    ctx = lib.seccomp_init(ALLOW)
    try:
        for name, cmps in spec["notify"]:
            _add(lib, ctx, NOTIFY, name, cmps)
        for name in spec["deny"]:
            _add(lib, ctx, NOTIFY, name, [])
        rc = lib.seccomp_load(ctx)
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc))
        fd = lib.seccomp_notify_fd(ctx)
        if fd < 0:
            raise OSError(-fd, os.strerror(-fd))
        return int(fd)
    except OSError as exc:
        why = f"the kernel refused a user-notification filter ({exc.strerror or exc})"
    finally:
        lib.seccomp_release(ctx)
    ctx = lib.seccomp_init(ALLOW)
    for name in spec["deny"]:
        _add(lib, ctx, ERRNO_EPERM, name, [])
    rc = lib.seccomp_load(ctx)
    lib.seccomp_release(ctx)
    if rc < 0:
        return f"{why}; the plain refusals failed too ({os.strerror(-rc)})"
    return why


def main(argv: list[str]) -> None:
    """Installs the filter, hands the listener to the server, execs the command (never returns)."""
    sock_fd, spec_text, sep, *command = argv
    if sep != "--" or not command:
        sys.exit("usage: watch_launch.py SOCKET_FD SPEC -- COMMAND...")
    sock = socket.socket(fileno=int(sock_fd))
    got = _install(json.loads(spec_text))
    if isinstance(got, int):
        socket.send_fds(sock, [b"fd"], [got])
        os.close(got)
    else:
        sock.sendall(b"no:" + got.encode()[:500])
    sock.close()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"kb-mcp sandbox: cannot run {command[0]}: {exc}\n")
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
