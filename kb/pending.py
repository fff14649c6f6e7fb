"""Transactions persisted before the KB lock is taken, committed by whichever transaction comes next.

A finished verification must not be lost because another process holds the KB lock (a hung or
slow holder): its record is written here first, atomically and fsynced, one file per key, then
committed. Every transaction of every process folds in what it finds here (`KBStore.transaction`)
and removes the files once its commit is durable, so a pending record survives the process that
wrote it. Only whole-record puts are accepted: applying one twice (a crash between the commit and
the removal) changes nothing.

Files: ``<artifacts>/pending/<key>.json`` holding ``{"key": ..., "ops": [...], "crc": ...}``.
"""

from __future__ import annotations

import logging
import os
import re
import zlib
from pathlib import Path
from typing import Any

from kb_mcp.kb import journal, jsontext
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.ops import newer_op
from kb_mcp.kb.tables import Tables

log = logging.getLogger(__name__)

_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,160}$")


def check_ops(ops: list[Any]) -> None:
    """Raises ValueError unless every op is a whole-record put (safe to apply late, and twice)."""
    for op in ops:
        if not (isinstance(op, list) and len(op) == 4 and op[0] == "put" and op[1] != "meta"):
            raise ValueError(f"only whole-record puts can wait for the lock, not {str(op)[:80]}")


def _check_applies(ops: list[Any]) -> None:
    """Raises ValueError unless `ops` apply (to an empty KB: whole-record puts need nothing else).

    A file read back is untrusted like any file of a KB (another kb-mcp version, a hand edit): one
    whose ops do not apply would fail every transaction of every process that folds it in.
    """
    try:
        Tables().replay(ops)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"its records do not apply ({type(exc).__name__}: {exc})") from exc


def write(folder: Path, key: str, ops: list[Any], mode: int) -> Path:
    """Persists `ops` under `key` (replacing an earlier file of that key); durable on return."""
    if not _KEY.match(key):
        raise ValueError(f"pending key {key!r}: letters, digits, '_', '.', '-' only")
    check_ops(ops)
    folder.mkdir(parents=True, exist_ok=True)
    body = jsontext.dumps(ops, separators=(",", ":"))
    blob = jsontext.dumps({"key": key, "crc": zlib.crc32(body.encode()), "ops": ops}, separators=(",", ":")).encode()
    path = folder / f"{key}.json"
    write_atomic(path, blob, mode=mode, fsync=True)  # a temp file per writer: threads may write one key at once
    journal.fsync_dir(folder)
    return path


def read_all(folder: Path) -> list[tuple[Path, list[Any]]]:
    """Every readable pending file with its ops, oldest first. A damaged one is moved to
    ``pending/damaged/`` with a warning (it can be inspected; it is never applied). One whose checksum
    holds but which has an op a newer kb-mcp wrote raises KBNewerFormatError naming it, left in place."""
    try:
        entries = [e for e in os.scandir(folder) if e.name.endswith(".json") and not e.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for entry in sorted(entries, key=lambda e: e.stat().st_mtime_ns):
        path = Path(entry.path)
        try:
            doc = jsontext.loads(path.read_bytes())
            ops = doc["ops"]
            if zlib.crc32(jsontext.dumps(ops, separators=(",", ":")).encode()) != doc["crc"]:
                raise ValueError("checksum mismatch")
            newer = newer_op(ops) if isinstance(ops, list) else None
            if newer is not None:  # a newer kb-mcp's record, not damage: refused, never set aside
                raise newer.located(path)
            check_ops(ops)
            _check_applies(ops)
        except FileNotFoundError:
            continue  # committed and removed by another process meanwhile
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _set_aside(path, exc)
            continue
        out.append((path, ops))
    return out


def _set_aside(path: Path, why: Exception) -> None:
    """Moves a damaged pending file to ``damaged/`` beside it; it is never applied either way."""
    damaged = path.parent / "damaged"
    try:
        damaged.mkdir(exist_ok=True)
        os.replace(path, damaged / path.name)
    except OSError as exc:  # it stays, skipped by every transaction, warned about each time
        log.warning("pending KB record %s is damaged (%s) and could not be moved to %s (%s); not applied", path,
                    why, damaged, exc.strerror or exc)
        return
    log.warning("pending KB record %s is damaged (%s); moved to %s, not applied", path, why, damaged)


def remove(paths: list[Path]) -> None:
    """Removes pending files whose ops are now committed."""
    for path in paths:
        path.unlink(missing_ok=True)


def count(folder: Path) -> int:
    """How many records are waiting."""
    try:
        return sum(1 for e in os.scandir(folder) if e.name.endswith(".json") and not e.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return 0
