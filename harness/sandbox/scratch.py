"""Scratch folders of sandboxed processes: one per process, under a root outside the cache, the KB and
home, named after the server process that made it so that a later server can sweep those whose
maker died (`sweep_scratch`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from kb_mcp.kb.owners import process_alive

__all__ = ["new_scratch", "scratch_root", "sweep_scratch"]


def scratch_root() -> Path:
    """Where sandboxes' scratch folders are made (outside the cache, the KB and home)."""
    root = Path(tempfile.gettempdir()) / f"kb-mcp-sandbox-{os.getuid()}"
    root.mkdir(mode=0o711, exist_ok=True)
    return root


def new_scratch(label: str) -> Path:
    """A fresh scratch folder, named after this process (see `sweep_scratch`)."""
    return Path(tempfile.mkdtemp(prefix=f"{label}-{os.getpid()}-", dir=scratch_root()))


def sweep_scratch() -> None:
    """Removes scratch folders of processes that no longer run (a server killed with SIGKILL)."""
    root = scratch_root()
    for folder in root.iterdir():
        try:
            pid = int(folder.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not process_alive(pid):
            shutil.rmtree(folder, ignore_errors=True)
