"""Every error kb-mcp raises on purpose, grouped by whose it is to fix.

    KbMcpError                      base; `whose`, `where` (a path, when there is one), `action`
    ├── CallerError                 the caller's mistake (bad arguments): fix them and call again
    │   └── ToolError               a tool refused its request (`kb_mcp.tools.base` re-exports it)
    ├── EnvironmentFault            the environment's: says what and where, and what the operator can do;
    │   │                           calling again with other arguments does not help
    │   ├── KBFileError             the KB cannot be used as it is (file, journal, lock)
    │   │   ├── KBMissingError      no KB file at the path, though something of a KB is there
    │   │   ├── KBCorruptError      a damaged file or journal line (file, line, byte offset; a copy is kept)
    │   │   ├── KBNewerFormatError  a file or journal line written by a newer kb-mcp: upgrade, never repair
    │   │   ├── KBReadOnlyError     the KB file or its folder is read-only: kb-mcp will not write it
    │   │   ├── KBLockTimeout       another process held the KB lock too long (its pid, host, since when)
    │   │   └── KBConflictError     the KB changed under a writer that held the lock (a deleted lock file)
    │   ├── StorageError            a file kb-mcp writes or reads failed: disk full, I/O error, permissions
    │   ├── SettingError            an environment variable (KB_MCP_...) holds a value kb-mcp cannot use
    │   └── InputEncodingError      a file given as input is not UTF-8 text
    └── InternalError               ours: a kb-mcp bug; the traceback is in the log

The server answers each group in its own words and with its own MCP error shape (`ErrorInfo` as the
result's structured content, see `kb_mcp.server.execution`); the CLI prints the message and exits
non-zero. This module is the lowest layer: every other one may import it, it imports nothing of ours.
"""

from __future__ import annotations

import errno
import os
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "CallerError",
    "EnvironmentFault",
    "EXIT_STATUS",
    "ErrorInfo",
    "Fault",
    "InputEncodingError",
    "InternalError",
    "KBConflictError",
    "KBCorruptError",
    "KBFileError",
    "KBLockTimeout",
    "KBMissingError",
    "KBNewerFormatError",
    "KBReadOnlyError",
    "KbMcpError",
    "SettingError",
    "StorageError",
    "ToolError",
    "Whose",
    "storage_error",
    "decode_utf8",
    "input_error",
    "names_no_file",
]

Whose = Literal["caller", "environment", "kb-mcp"]

Fault = Literal["usage", "caller", "environment", "kb-mcp"]
"""Whose a command's refusal is: `Whose`, or the command line's own ("usage": an unknown command or
option, or an option value no run could use), which only a command line has."""

EXIT_STATUS: dict[str, int] = {"caller": 1, "usage": 2, "environment": 3, "kb-mcp": 4}
"""The exit status of a kb-mcp command that failed with a fault of each kind: the one table every
command answers by (`kb_mcp.server.exit_status` names them; docs/agents.md, "Exit statuses", lists
them). 2 is also what argparse exits with for a command line it cannot parse."""


class ErrorInfo(BaseModel):
    """An error as an MCP client receives it (structured content of an `isError` tool result)."""

    model_config = ConfigDict(extra="forbid")

    whose: Whose
    type: str
    message: str
    where: str | None = None
    action: str | None = None
    incident: str | None = None  # for bugs: the id the server log shows beside the traceback


class KbMcpError(Exception):
    """Base of the errors kb-mcp raises on purpose.

    `message` says what went wrong, `where` names the file or folder concerned (if any), and
    `action` says what the one who can fix it should do. `str()` gives message and action.
    """

    whose: ClassVar[Whose] = "kb-mcp"

    def __init__(self, message: str, *, where: str | os.PathLike[str] | None = None, action: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.where = os.fspath(where) if where is not None else None
        self.action = action

    def __str__(self) -> str:
        if not self.action:
            return self.message
        return f"{self.message.rstrip('. ')}. {self.action[:1].upper()}{self.action[1:]}"

    def info(self) -> ErrorInfo:
        """The structured form sent to MCP clients."""
        return ErrorInfo(whose=self.whose, type=type(self).__name__, message=self.message, where=self.where,
                         action=self.action)


class CallerError(KbMcpError):
    """The caller's mistake: an argument that is wrong. The message says which and how to fix it."""

    whose = "caller"


class ToolError(CallerError):
    """A failure the calling agent can act on; the message says what was wrong and what to do.

    The MCP server turns it into an `isError` result; the CLI prints it and exits non-zero.
    """


class EnvironmentFault(KbMcpError):
    """The environment's fault (files, disk, lock, permissions, input encoding), not the caller's
    arguments and not a bug. The message says what and where; `action` what the operator can do."""

    whose = "environment"


class KBFileError(EnvironmentFault):
    """The KB cannot be used as it is (corrupt, foreign, newer schema, unreadable, missing, locked).

    The message names the file. The store never overwrites a file it refused.
    """


class KBMissingError(KBFileError):
    """No KB file at the path while something of a KB is there (journal, artifacts, backups):
    it was deleted or moved, and kb-mcp will not silently start an empty KB in its place."""


class KBCorruptError(KBFileError):
    """A damaged KB file or journal. `line` and `offset` locate the first bad journal line;
    `copy` is where a copy of the damaged file was kept."""

    def __init__(
        self,
        message: str,
        *,
        where: str | os.PathLike[str] | None = None,
        action: str | None = None,
        line: int | None = None,
        offset: int | None = None,
        copy: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(message, where=where, action=action)
        self.line = line
        self.offset = offset
        self.copy = os.fspath(copy) if copy is not None else None


class KBNewerFormatError(KBFileError):
    """The KB holds something this kb-mcp does not know, in a form that is not damage: a journal line
    whose checksum holds but whose op kind (or a field of a known op) is not one of this version's, a
    pending file likewise, or a KB file of a higher schema version. A newer kb-mcp wrote it (another
    server of a shared KB, or a KB copied from another machine), so the KB is refused as it is, and
    nothing reading it may drop, set aside or rewrite it (`kb repair` and `kb restore` refuse too):
    the fix is this machine's kb-mcp, not the KB.

    `found` says what was not known; `writer` names the kb-mcp that wrote it where the file says so.
    """

    def __init__(
        self,
        found: str,
        *,
        where: str | os.PathLike[str] | None = None,
        line: int | None = None,
        offset: int | None = None,
        writer: str | None = None,
    ) -> None:
        place = "" if where is None else f"{os.fspath(where)}: "
        if line is not None:
            place += f"line {line} (byte offset {offset}) "
        by = f" ({writer})" if writer else ""
        super().__init__(
            f"{place}holds {found}, which this kb-mcp does not know: a newer kb-mcp{by} wrote it. It is not damage; "
            "the KB is refused as it is and nothing in it is changed, set aside or dropped",
            where=where,
            action="upgrade kb-mcp on this machine to the version that wrote it (or a later one), as on every "
            "machine sharing this KB. Do not run `kb-mcp kb repair` or `kb-mcp kb restore` on it: the KB is not "
            "damaged, and both refuse it",
        )
        self.found, self.line, self.offset, self.writer = found, line, offset, writer

    def located(self, where: str | os.PathLike[str], *, line: int | None = None, offset: int | None = None,
                writer: str | None = None) -> KBNewerFormatError:
        """The same refusal naming the file (and line) that holds what was not known."""
        return KBNewerFormatError(self.found, where=where, line=line, offset=offset, writer=writer or self.writer)


class KBReadOnlyError(KBFileError):
    """The KB file (or its folder) is read-only; kb-mcp refuses to write rather than replace it."""


class KBLockTimeout(KBFileError):
    """Another process held the KB lock longer than this one would wait; the message names it."""


class KBConflictError(KBFileError):
    """The journal or file changed under a writer that held the lock: another process wrote without
    it (the lock file was deleted while held). Nothing was written by the refusing transaction."""


class StorageError(EnvironmentFault):
    """Reading or writing a file failed for a reason of the machine: disk full, quota, I/O error,
    permissions, a read-only file system."""


class SettingError(EnvironmentFault):
    """An environment variable holds a value kb-mcp cannot use (`kb.settings` reads them): the message
    names the variable, its value and what it takes. kb-mcp refuses to guess rather than run with a
    value its operator did not mean (a backup count of -1 read as 0 would delete every backup)."""


class InputEncodingError(EnvironmentFault):
    """A file given as input is not UTF-8 text; the message names it and the first bad byte."""


class InternalError(KbMcpError):
    """A kb-mcp bug: the message says what failed; the traceback is in the log."""

    whose = "kb-mcp"


_STORAGE_ACTIONS = {
    errno.ENOSPC: "free disk space on that file system, then try again",
    errno.EDQUOT: "free space within the disk quota of this account, then try again",
    errno.EACCES: "give this account permission on that path (or run kb-mcp as its owner)",
    errno.EPERM: "give this account permission on that path (or run kb-mcp as its owner)",
    errno.EROFS: "the file system is mounted read-only: remount it read-write or move the KB",
    errno.EIO: "the device reported an I/O error: check the disk (dmesg) before writing again",
    errno.EFBIG: "the file would grow past the size this process may write (`ulimit -f`) or its file system "
    "allows: raise that limit, or write to a file system that takes larger files",
}


def storage_error(exc: OSError, doing: str, path: str | os.PathLike[str] | None = None) -> EnvironmentFault:
    """Words an OSError met while `doing` something to `path` as the environment's fault."""
    where = os.fspath(path) if path is not None else (exc.filename if isinstance(exc.filename, str) else None)
    reason = exc.strerror or str(exc)
    action = _STORAGE_ACTIONS.get(exc.errno or 0, "check that path and the file system it is on, then try again")
    return StorageError(f"cannot {doing} {where or ''}: {reason}".replace("  ", " "), where=where, action=action)


_MISSING = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG)


def names_no_file(exc: OSError) -> bool:
    """Whether `exc` says the path itself names no readable file (none there, a folder, a file
    where a folder should be): the one who gave the path can fix it, unlike permissions or a disk."""
    return exc.errno in _MISSING


def input_error(exc: OSError, what: str, path: str | os.PathLike[str]) -> KbMcpError:
    """Words an OSError met reading `what` (a file the caller named) at `path`: a path that names no
    file is the caller's mistake; permissions, a full or failing disk are the machine's (`storage_error`)."""
    if names_no_file(exc):
        where = os.fspath(path)
        return CallerError(f"cannot read {what} {where}: {exc.strerror or exc}", where=where,
                           action="give the path of an existing file")
    return storage_error(exc, f"read {what}", path)


def decode_utf8(data: bytes, where: str | os.PathLike[str]) -> str:
    """`data` as text, or InputEncodingError naming `where` and the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputEncodingError(
            f"{os.fspath(where)} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            where=where,
            action=f"save {os.fspath(where)} as UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8`), then call again as before",
        ) from exc
