"""The progress callback that every long operation takes, from the harness up to the MCP server.

`progress(done, total, message)`: `total` is None while the amount of work is unknown. A callback
may raise to stop the work (a cancelled MCP call or job), so callers report only at points where
stopping is safe.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Progress", "no_progress"]


class Progress(Protocol):
    """Reports progress of long work (the server forwards it as MCP progress notifications)."""

    def __call__(self, done: float, total: float | None = None, message: str | None = None) -> None: ...


def no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    """Progress sink for callers that do not display progress."""
