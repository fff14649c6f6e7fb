"""Logging for the CLI and the server: always to stderr.

On stdio, stdout is the MCP wire: one stray byte there corrupts the client's stream. Logging is
configured before the SDK's MCPServer configures its own (which is then a no-op), so every
record, ours, the SDK's and uvicorn's, goes to stderr in one format.
"""

from __future__ import annotations

import logging
import sys

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def configure(level: str = "INFO") -> None:
    """Routes all logging to stderr at `level` (replacing handlers a library may have installed)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(level.upper())
    # httpx-style request lines at INFO would drown the server's own messages
    for noisy in ("httpx", "httpx2", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
