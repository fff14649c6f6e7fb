"""Append-only journal of committed KB changes, kept beside the TinyDB file.

Why: the KB file of record is one JSON document. Rewriting it for every recorded outcome costs
time proportional to the whole KB (seconds for a KB of a million scores), so small transactions
append one line here instead, and the store folds the journal into the file now and then
("compaction", under the same lock).

Format: one JSON object per line, written by one ``write`` call and fsynced before the lock is
released::

    {"crc":"1a2b3c4d","seq":7,"at":1234,"ops":[...]}

* ``crc`` is the CRC-32 of every byte after ``{"crc":"........",`` up to the newline, so a damaged
  line is told apart from a good one (lines of older versions, ``{"seq":..,"ops":..}`` without
  ``crc`` and ``at``, are still read).
* ``seq`` grows by one per transaction; the TinyDB file records the last sequence folded into it
  (``applied_seq``), so a line that survived a crash between "write the new file" and "empty the
  journal" is skipped, never applied twice.
* ``at`` is the byte offset where the writer expected its line to start: the end of the last
  entry it had read. A line found anywhere else lost a race with a writer that did not hold the
  lock (its writer saw that and reported the transaction as not committed), so readers skip it.

A line whose checksum holds but which has fields this version does not know was written by a newer
kb-mcp, not damaged: it raises `KBNewerFormatError` (as does an op of a newer kind, `kb.ops.from_wire`),
and nothing reading it drops, sets aside or rewrites it. The one optional field this version knows is
``by``, the writer's name and version, which it reads (to name the writer in that refusal) but does
not write: versions before it call any line with a field beyond ``crc``/``seq``/``at``/``ops`` damaged.

Only an incomplete *last* line (no newline: a writer killed mid-write, or one still writing) is
ever ignored, and only a writer holding the lock cuts it. A complete line that fails its checks is
damage: reading stops there and the store refuses the KB until ``kb-mcp kb repair`` has salvaged
every valid transaction (`salvage`).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb_mcp.kb import jsontext
from kb_mcp.kb.atomic import temp_beside
from kb_mcp.kb.errors import KBConflictError, KBNewerFormatError, KBReadOnlyError

_CRC_PREFIX = b'{"crc":"'
_CRC_HEAD = len(_CRC_PREFIX) + 8 + 2  # '{"crc":"' + 8 hex digits + '",'
_LEGACY_KEYS = frozenset({"seq", "ops"})
_KEYS = frozenset({"crc", "seq", "at", "ops"})
_OPTIONAL_KEYS = frozenset({"by"})


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
    """One committed transaction; `at` is None for lines written before lines carried it, `by` (the
    writer's kb-mcp and version) for lines that do not name it."""

    seq: int
    ops: list[list[Any]]
    at: int | None = None
    by: str | None = None


@dataclass(frozen=True)
class BadLine:
    """A complete journal line that fails its checks, located by byte offset."""

    offset: int
    length: int
    reason: str


@dataclass
class Chunk:
    """What one read of the journal found: entries with their start offsets, the offset just after
    the last good complete line, and the first bad complete line (reading stops there)."""

    entries: list[tuple[int, Entry]]
    end: int
    bad: BadLine | None = None


def encode(entry: Entry) -> bytes:
    """The journal line of `entry` (with checksum and expected offset, newline-terminated)."""
    body = jsontext.dumps({"seq": entry.seq, "at": entry.at, "ops": entry.ops}, separators=(",", ":")).encode()[1:]
    return b'%s%08x",%s\n' % (_CRC_PREFIX, zlib.crc32(body), body)


def decode(line: bytes) -> Entry:
    """Parses one line (without its newline); raises ValueError saying what is wrong with it, or
    KBNewerFormatError (unlocated: see `newer_at`) for a checksummed line with fields a newer kb-mcp wrote."""
    if line.startswith(_CRC_PREFIX):
        if len(line) < _CRC_HEAD or line[_CRC_HEAD - 2:_CRC_HEAD] != b'",':
            raise ValueError("malformed checksum field")
        try:
            expected = int(line[len(_CRC_PREFIX):_CRC_HEAD - 2], 16)
        except ValueError as exc:
            raise ValueError("malformed checksum field") from exc
        if zlib.crc32(line[_CRC_HEAD:]) != expected:
            raise ValueError("checksum mismatch (the line was changed after it was written)")
        keys = _KEYS
    else:
        keys = _LEGACY_KEYS
    try:
        obj = jsontext.loads(line)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from exc
    if not isinstance(obj, dict) or not keys <= obj.keys():
        raise ValueError("not a journal entry (missing fields)")
    extra = obj.keys() - keys
    if extra and keys is _LEGACY_KEYS:  # lines without a checksum come from versions that wrote no more
        raise ValueError("not a journal entry (unexpected fields)")
    seq, ops, at, by = obj["seq"], obj["ops"], obj.get("at"), obj.get("by")
    if not isinstance(by, str | None):
        raise ValueError("not a journal entry (fields of the wrong type)")
    if extra - _OPTIONAL_KEYS:  # the checksum holds: a newer kb-mcp wrote these
        raise KBNewerFormatError(f"journal fields {sorted(extra - _OPTIONAL_KEYS)}", writer=by)
    if not isinstance(seq, int) or not isinstance(ops, list) or not (at is None or isinstance(at, int)):
        raise ValueError("not a journal entry (fields of the wrong type)")
    return Entry(seq, ops, at, by)


def newer_at(path: Path, offset: int, exc: KBNewerFormatError, by: str | None = None) -> KBNewerFormatError:
    """`exc` located at the journal line of `path` that starts at byte `offset`."""
    return exc.located(path, line=line_number(path, offset), offset=offset, writer=by)


def read_entries(path: Path, offset: int) -> Chunk:
    """Complete entries from byte `offset` on.

    Stops before an incomplete last line (no newline yet) and at the first complete line that is
    damaged (`Chunk.bad`); `Chunk.end` never moves past either. A line a newer kb-mcp wrote raises
    KBNewerFormatError naming it.
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return Chunk([], offset)
    entries: list[tuple[int, Entry]] = []
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        try:
            entries.append((offset + pos, decode(data[pos:nl])))
        except ValueError as exc:
            return Chunk(entries, offset + pos, BadLine(offset + pos, nl - pos + 1, str(exc)))
        except KBNewerFormatError as exc:
            raise newer_at(path, offset + pos, exc) from None
        pos = nl + 1
    return Chunk(entries, offset + pos)


def append_entry(path: Path, entry: Entry, expected_size: int, *, expected_ino: int | None,
                 mode: int) -> tuple[int, int]:
    """Appends `entry` (the caller holds the KB lock); returns the journal's new size and inode.

    `expected_size` and `expected_ino` describe the journal as the caller last read it. Bytes
    beyond `expected_size` without a newline are a torn write of a killed writer and are cut off;
    a complete line there, a shorter or replaced journal, or a line that lands anywhere but at
    `expected_size` means another process wrote without the lock: KBConflictError, and nothing
    already in the journal is touched.
    """
    entry.at = expected_size
    line = encode(entry)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, mode)
    try:
        st = os.fstat(fd)
        if not st.st_mode & 0o222:  # root may write anyway; a read-only journal means a read-only KB
            raise KBReadOnlyError(
                f"the KB journal {path} is read-only (mode {st.st_mode & 0o7777:04o}); kb-mcp does not write a "
                "read-only KB", where=path, action=f"to record into this KB, make it writable (`chmod u+w {path}`)")
        if expected_ino is not None and st.st_ino != expected_ino:
            raise _conflict(path, "was replaced since this process read it")
        if st.st_size < expected_size:
            raise _conflict(path, f"is shorter ({st.st_size} bytes) than when this process read it ({expected_size})")
        if st.st_size > expected_size:
            tail = os.pread(fd, st.st_size - expected_size, expected_size)
            if b"\n" in tail:
                raise _conflict(path, f"has an entry at byte {expected_size} that this process did not expect")
            os.ftruncate(fd, expected_size)  # a killed writer's torn line: never anything committed
        _write_all(fd, line, path, expected_size)
        end = os.lseek(fd, 0, os.SEEK_CUR)
        os.fsync(fd)
        if end - len(line) != expected_size:
            raise _conflict(path, f"grew while this entry was written (it landed at byte {end - len(line)}, "
                            f"not {expected_size}; readers skip it)")
        if _ino(path) != st.st_ino:
            raise _conflict(path, "was replaced while this entry was written")
        if os.pread(fd, len(line), expected_size) != line:
            raise _conflict(path, "was cut or overwritten while this entry was written")
    finally:
        os.close(fd)
    return expected_size + len(line), st.st_ino


def _write_all(fd: int, data: bytes, path: Path, start: int) -> None:
    view = memoryview(data)
    try:
        while view:  # os.write may write less than asked on a full disk or a signal
            view = view[os.write(fd, view):]
    except BaseException:
        # A partial line of ours would read as a torn write; take it back while we hold the lock.
        try:
            if os.fstat(fd).st_size == start + len(data) - len(view):
                os.ftruncate(fd, start)
        except OSError:
            pass
        raise


def _ino(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _conflict(path: Path, what: str) -> KBConflictError:
    return KBConflictError(
        f"{path}: the KB journal {what}: another process wrote to it without holding the KB lock "
        "(was the lock file deleted?). This transaction was not committed",
        where=path,
        action="call again; if it keeps happening, find the other writer (`kb-mcp kb stats` names the lock holder) "
        "and never delete the lock file",
    )


def reset(path: Path, mode: int, gid: int = -1) -> None:
    """Replaces the journal with an empty file (a new inode, so readers notice and re-read)."""
    tmp = temp_beside(path, hidden=False)  # `<name>.tmp-*`: what a compaction sweeps after a killed writer
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        set_mode(fd, mode, gid)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def set_mode(fd: int, mode: int, gid: int = -1) -> None:
    """Gives a file kb-mcp created the KB's mode and group (the umask must not widen or narrow it)."""
    if gid >= 0:
        try:
            os.fchown(fd, -1, gid)
        except OSError:
            pass  # not a member of that group: the file keeps this account's primary group
    os.fchmod(fd, mode)


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


def line_number(path: Path, offset: int) -> int:
    """The 1-based line number of the line starting at byte `offset`."""
    n = 1
    with open(path, "rb") as f:
        remaining = offset
        while remaining > 0:
            block = f.read(min(remaining, 1 << 20))
            if not block:
                break
            n += block.count(b"\n")
            remaining -= len(block)
    return n


@dataclass
class Salvage:
    """Everything a damaged journal still holds: good entries (offset, line number, entry) in file
    order, and the damaged stretches that were left out."""

    entries: list[tuple[int, int, Entry]]
    bad: list[tuple[int, BadLine]]
    torn_tail: int = 0  # bytes of an incomplete last line


def salvage(path: Path) -> Salvage:
    """Reads the whole journal, keeping every line that passes its checks.

    A damaged line may hide a good entry after its damage (two lines whose newline was lost): each
    checksummed entry start inside it is tried too. A line (or an entry inside one) that a newer kb-mcp
    wrote raises KBNewerFormatError naming it: it is not damage to salvage around.
    """
    data = path.read_bytes() if path.exists() else b""
    out = Salvage([], [])
    pos, line_no = 0, 1
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            out.torn_tail = len(data) - pos
            break
        raw = data[pos:nl]
        try:
            try:
                out.entries.append((pos, line_no, decode(raw)))
            except ValueError as exc:
                out.bad.append((line_no, BadLine(pos, nl - pos + 1, str(exc))))
                for inner, entry in _entries_inside(raw):
                    out.entries.append((pos + inner, line_no, entry))
        except KBNewerFormatError as exc:
            raise exc.located(path, line=line_no, offset=pos) from None
        pos, line_no = nl + 1, line_no + 1
    return out


def _entries_inside(raw: bytes) -> Iterator[tuple[int, Entry]]:
    start = raw.find(_CRC_PREFIX, 1)
    while start > 0:
        try:
            yield start, decode(raw[start:])
            return
        except ValueError:
            start = raw.find(_CRC_PREFIX, start + 1)
