"""Logging for the CLI and the server: always to stderr.

On stdio, stdout is the MCP wire: one stray byte there corrupts the client's stream. Logging is
configured before the SDK's MCPServer configures its own (`logging.basicConfig`, then a no-op
because the root logger has a handler), so every record, ours, the SDK's and uvicorn's, goes to
stderr in one format.
"""

from __future__ import annotations

import logging
import sys

from kb_mcp.harness.sandbox.attempts import Attempt, on_attempt

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time of the record (it may be replaced later)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure(level: str = "INFO") -> None:
    """Routes logging to stderr at `level`: one stderr handler on the root logger, added once."""
    root = logging.getLogger()
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(level.upper())
    # per-request lines of the HTTP stack at INFO would drown the server's own messages
    for noisy in ("httpx", "httpx2", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


_attempts_log = logging.getLogger("kb_mcp.attempts")


def _log_attempt(attempt: Attempt, clients: str) -> None:
    _attempts_log.warning("sandbox attempt by %s: %s", clients or "an unnamed client", attempt.line())


def log_attempts() -> None:
    """Logs every attempt a sandboxed process makes (`harness.sandbox.attempts`) with the name of the client
    whose work it was: the owner of a shared server sees who tried what."""
    on_attempt(_log_attempt)
