"""Rotated copies of the KB file, made at each compaction, kept in ``<kb stem>.backups/`` beside it.

A compaction writes the whole KB to a new file; right after, a copy of that file is kept here and
all but the newest `keep` copies are removed. The newest backup plus the journal is the whole KB,
so `kb-mcp kb restore` brings back a deleted or damaged KB file without losing a transaction;
an older backup goes back in time.

A backup is named ``<kb name>.<UTC time>.seq<applied_seq>.json``, so names sort by age.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kb_mcp.kb import journal, paths, settings
from kb_mcp.kb.atomic import temp_beside

ENV_BACKUPS = "KB_MCP_BACKUPS"
DEFAULT_KEEP = 5

_NAME = re.compile(r"^(?P<stem>.+)\.(?P<when>\d{8}T\d{6}\d{6}Z)\.seq(?P<seq>\d+)\.json$")


def default_keep() -> int:
    """How many backups a compaction keeps (``KB_MCP_BACKUPS``, default 5; 0 keeps none); SettingError
    for a value that is not a whole number >= 0 (one read as 0 would delete every backup)."""
    return settings.count(ENV_BACKUPS, DEFAULT_KEEP)


@dataclass(frozen=True)
class Backup:
    """One backup file."""

    path: Path
    created: datetime
    applied_seq: int
    size: int


def list_backups(kb_path: Path) -> list[Backup]:
    """The backups of the KB at `kb_path`, newest first."""
    folder = paths.backups_dir(kb_path)
    found = []
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        m = _NAME.match(name)
        if not m or m.group("stem") != kb_path.name:
            continue
        try:
            when = datetime.strptime(m.group("when"), "%Y%m%dT%H%M%S%fZ").replace(tzinfo=timezone.utc)
        except ValueError:
            continue  # shaped like a backup's name but no time: not one of ours (the folder is the operator's too)
        try:
            st = (folder / name).stat()
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue  # a folder or device under a backup's name is no backup (and rotation must not remove it)
        found.append(Backup(folder / name, when, int(m.group("seq")), st.st_size))
    return sorted(found, key=lambda b: (b.created, b.applied_seq), reverse=True)


def make_backup(kb_path: Path, applied_seq: int, keep: int, mode: int, gid: int = -1) -> Path | None:
    """Copies the KB file into its backups folder and drops all but the newest `keep` (the caller
    holds the KB lock). Returns the new backup, or None when `keep` is 0."""
    if keep <= 0:
        return None
    folder = paths.backups_dir(kb_path)
    folder.mkdir(mode=0o700 if not mode & 0o070 else 0o770, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    dest = folder / f"{kb_path.name}.{stamp}.seq{applied_seq}.json"
    tmp = temp_beside(dest)
    shutil.copyfile(kb_path, tmp)  # copy_file_range/sendfile: in the kernel, no fsync (a backup is a spare)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        journal.set_mode(fd, mode, gid)
    finally:
        os.close(fd)
    os.replace(tmp, dest)
    for old in list_backups(kb_path)[keep:]:
        old.path.unlink(missing_ok=True)
    for stray in folder.glob(f".{kb_path.name}.*.tmp-*"):  # copies of a process killed mid-copy
        stray.unlink(missing_ok=True)
    return dest
