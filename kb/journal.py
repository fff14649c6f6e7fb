"""Append-only journal of committed KB changes, kept beside the TinyDB file.

Why: the KB file of record is one JSON document. Rewriting it for every recorded outcome costs
time proportional to the whole KB (seconds for a KB of a million scores), so small transactions
append one line here instead, and the store folds the journal into the file now and then
("compaction", under the same lock).

Format: one JSON object per line, ``{"seq": N, "ops": [...]}``, each line written by one
``write`` call and fsynced before the lock is released. Sequence numbers grow by one per
transaction; the TinyDB file records the last sequence folded into it (``applied_seq``), so a
line that survived a crash between "write the new file" and "empty the journal" is skipped,
never applied twice. A last line without its newline is a write cut short (a killed writer):
readers ignore it and the next writer truncates it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class FileId:
    """Identity of one version of a file: a replaced file has a new inode, a grown one a new size."""

    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileId | None:
        """The current identity, or None when the file does not exist."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return cls(st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class Entry:
    """One committed transaction."""

    seq: int
    ops: list[list[Any]]


def read_entries(path: Path, offset: int) -> tuple[list[Entry], int]:
    """Complete entries from byte `offset` on, and the offset just after the last complete one.

    Stops at the first line that is incomplete (no newline yet, or a killed writer's torn line)
    or unparsable; the returned offset never moves past such a line.
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    entries: list[Entry] = []
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        try:
            obj = json.loads(data[pos:nl])
            entries.append(Entry(int(obj["seq"]), obj["ops"]))
        except (ValueError, KeyError, TypeError):
            break
        pos = nl + 1
    return entries, offset + pos


def append_entry(path: Path, entry: Entry, valid_size: int) -> int:
    """Appends `entry` (caller holds the KB lock) and returns the journal's new size.

    Bytes beyond `valid_size` (the end of the last complete entry, as the caller just read it)
    are a torn write of a killed writer: they are cut off first so the new line starts clean.
    """
    line = json.dumps({"seq": entry.seq, "ops": entry.ops}, separators=(",", ":")).encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != valid_size:
            os.ftruncate(fd, valid_size)
        os.lseek(fd, valid_size, os.SEEK_SET)
        view = memoryview(line)
        while view:  # os.write may write less than asked on a full disk or a signal
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    return valid_size + len(line)


def reset(path: Path) -> None:
    """Replaces the journal with an empty file (a new inode, so readers notice and re-read)."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Makes a rename in `folder` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
