"""What tool functions share: the error an agent can act on, and the progress callback."""

from __future__ import annotations

from typing import Protocol


class ToolError(Exception):
    """A failure the calling agent can act on; the message says what was wrong and what to do.

    The MCP server turns it into an `isError` result; the CLI prints it and exits non-zero.
    """


class Progress(Protocol):
    """Reports progress of a long tool call (the server forwards it as MCP progress notifications)."""

    def __call__(self, done: float, total: float | None = None, message: str | None = None) -> None: ...


def no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    """Progress sink for callers that do not display progress."""
