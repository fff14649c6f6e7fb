"""What a sandboxed process tried and was refused or could not reach, and what a verdict makes of it.

The record itself is gathered from outside the sandbox, through the kernel (`harness.sandbox.watch`): this
module holds what the record is (`Attempt`, `AttemptLog`), which logs a sandboxed process reports
to (`collecting`: the logs active on the thread that starts it), the one list of programs a
sandboxed process may start without it being an attempt (`program_allowed`), the redaction of
secret-looking text, and the `sandbox_attempt` finding with the server's policy for it:

* `flag` (the default): the verdict stays as measured, is flagged (never credited by
  `record_outcome`, listed by `kb-mcp kb candidates --flagged`) and carries the finding;
* `invalid` (`KB_MCP_ATTEMPTS=invalid`, or `kb-mcp serve --attempts invalid`): the verdict is
  `invalid` outright.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from kb_mcp.kb import settings

ENV_ATTEMPTS = "KB_MCP_ATTEMPTS"  # "flag" (the default) or "invalid"
Policy = Literal["flag", "invalid"]
# `build`: a compiler flag, folder or #include the allow-lists refused (`allow_lists.tried_outside`)
AttemptKind = Literal["program", "network", "write", "read", "syscall", "tamper", "build", "flood"]
MAX_KEPT = 64  # attempts kept per log; the rest are counted (a flood is itself recorded)

log = logging.getLogger("kb_mcp.attempts")


class Attempt(BaseModel):
    """One thing a sandboxed process tried: what kind, what exactly (redacted), in which role."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: AttemptKind
    what: str  # e.g. "connect 1.1.1.1:443", "execve /usr/bin/curl", "open /home/u/.ssh/id_rsa for writing"
    role: str = ""  # the sandbox role it came from (worker, build, compiler, driver, tool)

    def line(self) -> str:
        """One line for summaries and logs."""
        return f"{self.kind}: {self.what}" + (f" ({self.role})" if self.role else "")


class AttemptLog:
    """The attempts of one piece of work (a verification, a census, a build), thread-safe and capped."""

    def __init__(self, client: str = "") -> None:
        self._lock = threading.Lock()
        self.client = client  # who asked for the work (an MCP client's name; "" when unknown)
        self._kept: list[Attempt] = []
        self._seen: set[Attempt] = set()
        self.dropped = 0  # attempts beyond MAX_KEPT
        self.unrecorded: set[str] = set()  # why some process of this work could not be watched

    def add(self, attempt: Attempt) -> None:
        """Keeps `attempt` (once), or counts it once the log is full."""
        with self._lock:
            if attempt in self._seen:
                return
            if len(self._kept) >= MAX_KEPT:
                self.dropped += 1
                return
            self._seen.add(attempt)
            self._kept.append(attempt)

    def not_recorded(self, why: str) -> None:
        """Notes that a process of this work ran without a record, and why."""
        with self._lock:
            self.unrecorded.add(why)

    @property
    def attempts(self) -> list[Attempt]:
        """The attempts kept, in the order they came; a flood ends with a `flood` entry."""
        with self._lock:
            kept = list(self._kept)
            dropped = self.dropped
        if dropped:
            kept.append(Attempt(kind="flood", what=f"{dropped} more attempts, not kept"))
        return kept


_ACTIVE: contextvars.ContextVar[tuple[AttemptLog, ...]] = contextvars.ContextVar("kb_mcp_attempt_logs", default=())
_CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("kb_mcp_attempt_client", default="")
_LISTENERS: list[Callable[[Attempt, str], None]] = []


@contextlib.contextmanager
def on_behalf_of(client: str) -> Iterator[None]:
    """Work started in the block (and its threads that copy the context) is done for `client`:
    the logs it collects name it, and so do the server's lines of their attempts."""
    token = _CLIENT.set(client)
    try:
        yield
    finally:
        _CLIENT.reset(token)


def clients_of(logs: Iterable[AttemptLog]) -> str:
    """The clients the work of these logs was done for, comma-separated ("" when none is known)."""
    return ", ".join(sorted({lg.client for lg in logs if lg.client}))


@contextlib.contextmanager
def collecting() -> Iterator[AttemptLog]:
    """A new log that every sandboxed process started on this thread (and context) reports to, for
    the duration of the block, besides the logs already active."""
    logbook = AttemptLog(_CLIENT.get())
    token = _ACTIVE.set(_ACTIVE.get() + (logbook,))
    try:
        yield logbook
    finally:
        _ACTIVE.reset(token)


def active_logs() -> tuple[AttemptLog, ...]:
    """The logs a process started now reports to."""
    return _ACTIVE.get()


def on_attempt(listener: Callable[[Attempt, str], None]) -> None:
    """Calls `listener` with every attempt recorded in this process (once per process tree or
    build) and the clients it was made for (`clients_of`): the server logs them."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)


def record(attempt: Attempt) -> None:
    """Records what the server refused itself, before any process ran (a build's flags and
    includes), in the logs active now, and tells the listeners."""
    logs = active_logs()
    for logbook in logs:
        logbook.add(attempt)
    announce(attempt, clients_of(logs) or _CLIENT.get())


def announce(attempt: Attempt, clients: str = "") -> None:
    """Tells the listeners (the server's log) of `attempt`, made for `clients`; never raises."""
    for listener in list(_LISTENERS):
        try:
            listener(attempt, clients)
        except Exception:  # a log line must never break a verification
            log.exception("attempt listener failed")


def policy() -> Policy:
    """What an attempt makes of a verdict on this server (`KB_MCP_ATTEMPTS`); any other value than
    'flag' or 'invalid' is refused by name (`kb.errors.SettingError`, the operator's to fix)."""
    return settings.word(ENV_ATTEMPTS, "flag", _POLICIES)


_POLICIES: dict[str, Policy] = {"flag": "flag", "invalid": "invalid"}


# ---------------------------------------------------------------------------------------------
# Programs: the one list of what a sandboxed process may start without it being an attempt

# Compilers and what they start (nvcc: cicc, ptxas, fatbinary, nvlink, cudafe++, the host compiler
# and its cc1plus, as, ld, collect2), the build tools torch's load_inline uses, the shell nvcc and
# make use, and what Python's ctypes.util and platform modules run to find libraries.
ALLOWED_PROGRAMS = frozenset({
    "sh", "bash", "dash", "cc", "c++", "cpp", "gcc", "g++", "clang", "clang++", "cc1", "cc1plus", "collect2",
    "lto-wrapper", "lto1", "as", "ld", "ld.bfd", "ld.gold", "ld.lld", "ar", "ranlib", "strip", "objdump",
    "objcopy", "nm", "readelf", "c++filt", "ninja", "make", "ldconfig", "ldconfig.real", "uname", "which", "file",
    "nvcc", "cicc", "ptxas", "fatbinary", "nvlink", "cudafe++", "cuobjdump", "nvdisasm", "nvprune", "cu++filt",
    "ncu", "ncu-ui", "nvidia-smi", "python", "python3",
})
_VERSIONED = re.compile(r"^(?:[a-z0-9_]+-linux-gnu-)?(?P<base>gcc|g\+\+|cpp|cc|c\+\+|python3|python|ld|as|"
                        r"clang|clang\+\+)(?:[-.]?\d+(?:\.\d+)*)?$")


def program_allowed(path: str, roots: tuple[str, ...], writable: tuple[str, ...],
                    readable: tuple[str, ...] = ()) -> bool:
    """Whether starting `path` is part of the toolchain's honest work: a program of the allow-list
    by name, or anything inside the toolchain's install folders (`roots`), never a file of the
    writable places (what the process wrote itself) but those mounted read-only inside them
    (`readable`: packages bound under /tmp, say)."""
    norm = os.path.normpath(path)
    if in_writable_place(norm, writable, readable):
        return False
    if any(_inside(norm, r) for r in roots):
        return True
    name = os.path.basename(norm)
    match = _VERSIONED.match(name)
    return name in ALLOWED_PROGRAMS or (match is not None and match.group("base") in ALLOWED_PROGRAMS)


def in_writable_place(path: str, writable: tuple[str, ...], readable: tuple[str, ...] = ()) -> bool:
    """Whether `path` lies where the process could have written it (a writable place, but not a
    read-only mount inside one)."""
    norm = os.path.normpath(path)
    return any(_inside(norm, w) for w in writable) and not any(_inside(norm, r) for r in readable)


SHELLS = frozenset({"sh", "bash", "dash"})


def toolchain_script(exe: str, cmdline: Sequence[str], roots: tuple[str, ...]) -> bool:
    """Whether a process is a shell running a script of the toolchain's install folders (`roots`):
    the `ncu` of a CUDA toolkit is such a script, and the programs it starts to find its own
    version (readlink, dirname, cut...) are its work, not the candidate's. `exe` is the process's
    executable as the kernel names it (a candidate cannot rewrite it); `cmdline` its arguments: the
    script is the first that is not an option, and an option that makes the shell read its commands
    from elsewhere (`-c` text, `-s` or `-i` standard input) means there is no script."""
    if os.path.basename(exe) not in SHELLS:
        return False
    args = list(cmdline[1:])
    while args and args[0].startswith("-") and args[0] != "--":
        if not _SCRIPT_OPTIONS.fullmatch(args.pop(0)):
            return False
    script = args[1] if args[:1] == ["--"] and len(args) > 1 else (args[0] if args else "")
    real = os.path.realpath(script)
    return script.startswith("/") and os.path.isfile(real) and any(_inside(real, r) for r in roots)


_SCRIPT_OPTIONS = re.compile(r"[-+][euxvnfpa]+")  # a script's shebang options that leave it the script


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


# ---------------------------------------------------------------------------------------------
# Redaction

_SECRET_ASSIGN = re.compile(r"(?i)\b([A-Z0-9_]*(?:TOKEN|KEY|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION)[A-Z0-9_]*"
                            r"\s*[=:]\s*)(\S+)")
_SECRET_WORD = re.compile(r"(?i)\b(?:sk|ghp|gho|ghs|xox[abpr]|kbtok|AKIA)[-_][A-Za-z0-9_-]{6,}|\bBearer\s+\S+|"
                          r"-----BEGIN [A-Z ]+-----[^\n]*|\b[A-Za-z0-9+_-]{32,}={0,2}")


def redact(text: str, limit: int = 300) -> str:
    """`text` without secret-looking parts (assignments to secret-looking names, tokens, keys, long
    opaque strings), at most `limit` characters."""
    text = _SECRET_ASSIGN.sub(lambda m: m.group(1) + "[redacted]", text)
    text = _SECRET_WORD.sub("[redacted]", text)
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def where(path: str | Path) -> str:
    """A path as an attempt names it (normalised, redacted)."""
    return redact(os.path.normpath(str(path)), 200)
