"""Where kb-mcp keeps its files, and with which permissions.

Resolution order for the KB file: an explicit path (``--kb``), then ``KB_MCP_KB``, then
``$KB_MCP_HOME/kb.json`` (``KB_MCP_HOME`` defaults to ``~/.kb-mcp``). Beside ``kb.json`` live its
journal (``kb.json.journal``), lock (``kb.json.lock``, ``kb.json.lock.holder``), artifacts
(``kb.artifacts/``) and backups (``kb.backups/``).

Permissions: a new KB is private to its owner (files 0600, folders 0700). A KB made for a team
(``kb-mcp kb init --group NAME``) is group-readable and -writable (0660, folders 2770 so new files
inherit the group). Every kb-mcp process on a KB creates its files alike (`umask_for`).
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


def backups_dir(kb_path: Path) -> Path:
    """Folder beside the KB for the rotated copies made at compaction (see `kb.backups`)."""
    return kb_path.with_name(kb_path.stem + ".backups")


def pending_dir(kb_path: Path) -> Path:
    """Transactions persisted before they could be committed (see `KBStore.commit_soon`)."""
    return artifacts_dir(kb_path) / "pending"


PRIVATE_FILE_MODE = 0o600
SHARED_FILE_MODE = 0o660


def folder_mode(file_mode: int) -> int:
    """The mode of folders holding files of `file_mode`: r-x where r, w where w, setgid when the
    group may write (new files then inherit the folder's group)."""
    perms = file_mode & 0o777
    mode = 0o700
    for shift in (3, 0):  # group, others
        granted = (perms >> shift) & 0o7
        if granted & 0o4:
            mode |= 0o5 << shift
        if granted & 0o2:
            mode |= 0o2 << shift
    return mode | (0o2000 if perms & 0o020 else 0)


def umask_for(file_mode: int) -> int:
    """The umask under which new files get no more access than a KB file of `file_mode` grants."""
    perms = file_mode & 0o777
    mask = 0
    for shift in (3, 0):  # group, others: take away what the KB file does not grant
        granted = (perms >> shift) & 0o7
        if not granted:
            mask |= 0o7 << shift
        elif not granted & 0o2:
            mask |= 0o2 << shift
    return mask


def cache_dir() -> Path:
    """Build and baseline cache, shared by every KB (``KB_MCP_CACHE`` or ``~/.cache/kb-mcp``)."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "kb-mcp").expanduser()
