"""Where kb-mcp keeps its files: the KB, the artifacts beside it, and the build cache.

Resolution order for the KB file: an explicit path (``--kb``), then ``KB_MCP_KB``, then
``$KB_MCP_HOME/kb.json`` (``KB_MCP_HOME`` defaults to ``~/.kb-mcp``).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_KB = "KB_MCP_KB"
ENV_HOME = "KB_MCP_HOME"
ENV_CACHE = "KB_MCP_CACHE"


def home_dir() -> Path:
    """kb-mcp's home folder (``KB_MCP_HOME`` or ``~/.kb-mcp``)."""
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".kb-mcp").expanduser()


def resolve_kb_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The KB file to use: `explicit`, else ``KB_MCP_KB``, else ``<home>/kb.json``."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    if os.environ.get(ENV_KB):
        return Path(os.environ[ENV_KB]).expanduser().resolve()
    return (home_dir() / "kb.json").resolve()


def artifacts_dir(kb_path: Path) -> Path:
    """Folder beside the KB for profiles, candidate sources and reports.

    It sits next to the KB file so every server process sharing one KB also shares its
    artifacts (a `profile_id` made by one server resolves in another).
    """
    return kb_path.with_name(kb_path.stem + ".artifacts")


def cache_dir() -> Path:
    """Build and baseline cache, shared by every KB (``KB_MCP_CACHE`` or ``~/.cache/kb-mcp``)."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "kb-mcp").expanduser()
