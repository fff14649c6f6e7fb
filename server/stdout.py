"""stdout whose reader went away (`kb-mcp kb states --json | head -1`): every command ends quietly
with `READER_GONE`, as a Unix tool killed by SIGPIPE does, whether it printed with `print` or
through a rich console. Imports nothing heavy: the CLI's entry point uses it."""

from __future__ import annotations

import errno
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

READER_GONE = 128 + 13  # 128 + SIGPIPE: what `yes | head -1` leaves as yes's exit status
INTERRUPTED = 128 + 2  # 128 + SIGINT: Ctrl-C, as a shell reports a program it interrupted


def reader_gone(exc: BaseException) -> bool:
    """True when `exc` is (or a task group wraps only) a write to a stdout whose reader closed it."""
    inner = getattr(exc, "exceptions", None)  # an exception group (its backport on Python 3.10)
    if isinstance(inner, tuple) and inner:
        return all(reader_gone(e) for e in inner)
    return isinstance(exc, BrokenPipeError)


def silence() -> None:
    """Points stdout at /dev/null, so that flushing it at exit does not fail again (the recipe in
    the documentation of Python's `signal` module, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def console(width: int, **options: Any) -> Console:
    """A rich console on stdout, `width` columns when piped (tables are not squeezed to 80), whose
    closed reader ends the command like any other write (rich would exit with status 1 itself)."""
    from rich.console import Console

    class _StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return _StdoutConsole(highlight=False, width=None if sys.stdout.isatty() else width, **options)
