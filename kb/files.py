"""The KB's files on disk, below the store: the TinyDB file written atomically (`AtomicJSONStorage`),
the mode new files take, copies kept of damaged files and the errors that name them, and what is
left of a KB whose file is gone (`what_remains`, `missing_error`). `kb.store` and `kb.lifecycle`
both build on it."""

from __future__ import annotations

import gc
import os
import re
import shutil
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinydb.storages import Storage

from kb_mcp.kb import backups, journal, jsontext, paths
from kb_mcp.kb.atomic import temp_beside
from kb_mcp.kb.errors import KBCorruptError, KBFileError, KBMissingError
from kb_mcp.kb.models import SCHEMA_VERSION, utcnow
from kb_mcp.kb.ops import newer_op
from kb_mcp.kb.tables import FORMAT

__all__ = [
    "AtomicJSONStorage", "JournalGap", "damaged_line_error", "gap_error", "has_content", "head_seq", "journal_of",
    "refuse_newer_lines",
    "damaged_file_hint", "keep_damaged_copy", "missing_error", "mode_of", "new_meta", "path_error", "read_from",
    "restore_hint", "what_remains",
]


class AtomicJSONStorage(Storage):
    """TinyDB storage that never leaves a torn file: write to a temp file, fsync, ``os.replace``.

    TinyDB's own JSONStorage truncates and rewrites in place, so a crash mid-write would leave
    half a file; this one can be handed to ``TinyDB(path, storage=AtomicJSONStorage)`` as well.
    A replaced file keeps its mode; a new one is private to its owner.
    """

    def __init__(self, path: str | os.PathLike[str], **_: Any) -> None:
        self.path = Path(path)

    def read(self) -> dict[str, dict[str, Any]] | None:
        """The parsed file, or None when it is missing or empty (TinyDB's convention)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        if not raw.strip():
            return None
        # A KB of a million scores is millions of small objects; the cyclic collector would
        # re-scan them all while they are being built, doubling the parse time.
        enabled = gc.isenabled()
        gc.disable()
        try:
            data: dict[str, dict[str, Any]] = jsontext.loads(raw)
            return data
        finally:
            if enabled:
                gc.enable()

    def write(self, data: dict[str, dict[str, Any]]) -> None:
        """Replaces the file atomically and durably with `data`."""
        mode, gid = mode_of(self.path)
        tmp = self.write_temp(data, mode, gid)
        try:
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        journal.fsync_dir(self.path.parent)

    def write_temp(self, data: dict[str, dict[str, Any]], mode: int, gid: int = -1) -> Path:
        """Writes `data` to a fsynced temp file beside the file (mode and group given); returns it."""
        blob = jsontext.dumps(data, separators=(",", ":")).encode()
        tmp = temp_beside(self.path, hidden=False)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            journal.set_mode(fd, mode, gid)
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return tmp

    def close(self) -> None:
        """Nothing is held open between calls."""


def keep_damaged_copy(path: Path) -> tuple[Path | None, str]:
    """Copies a damaged file aside once (named by its checksum); returns it and a phrase saying so."""
    try:
        data = path.read_bytes()
        copy = path.with_name(f"{path.name}.damaged-{zlib.crc32(data):08x}")
        if not copy.exists():
            tmp = temp_beside(copy, hidden=False)
            shutil.copyfile(path, tmp)
            os.replace(tmp, copy)
    except OSError as exc:
        return None, f"no copy of it could be kept ({exc.strerror or exc})"
    return copy, f"a copy of it is kept at {copy}"


def mode_of(path: Path) -> tuple[int, int]:
    """The permission bits and group new KB files take: the KB file's own, else private."""
    try:
        st = os.stat(path)
    except OSError:
        return paths.PRIVATE_FILE_MODE, -1
    return st.st_mode & 0o777, st.st_gid


def read_from(path: Path, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read()


def has_content(path: Path) -> bool:
    try:
        return os.stat(path).st_size > 0
    except FileNotFoundError:
        return False


def journal_of(kb_path: Path) -> Path:
    """The journal beside a KB file."""
    return kb_path.with_name(kb_path.name + ".journal")


def what_remains(kb_path: Path) -> list[str]:
    """What is left of a KB at `kb_path` besides its file: a journal, artifacts, backups (in words)."""
    out = []
    try:
        size = os.stat(journal_of(kb_path)).st_size
        if size:
            out.append(f"its journal ({size} bytes)")
    except FileNotFoundError:
        pass
    # Candidate sources and profiles are what KB records and agents refer to; job records, campaign
    # folders and pending records alone do not make a KB.
    art = paths.artifacts_dir(kb_path)
    files = 0
    for sub in ("candidates", "profiles"):
        for _, _, names in os.walk(art / sub):
            files += len(names)
    if files:
        out.append(f"{files} candidate and profile files in its artifacts folder {art}")
    found = backups.list_backups(kb_path)
    if found:
        out.append(f"{len(found)} backup(s) in {paths.backups_dir(kb_path)}, the newest from "
                   f"{found[0].created:%Y-%m-%d %H:%M} UTC")
    return out


def path_error(kb_path: Path) -> KBFileError | None:
    """Why no KB file can be at `kb_path` (a folder there, or a file where one of its folders should
    be), or None. `--kb`, `KB_MCP_KB` and `KB_MCP_HOME` all name it, so each answer says which to fix."""
    if kb_path.is_dir():
        return KBFileError(f"{kb_path}: is a directory, not a KB file", where=kb_path,
                           action="pass the path of the KB file itself (e.g. .../kb.json)")
    # The nearest existing folder above: a file there makes every path below it unusable (ENOTDIR).
    above = next((p for p in kb_path.parents if os.path.lexists(p)), None)
    if above is not None and not above.is_dir():
        return KBFileError(
            f"{kb_path}: {above} is a file, not a folder, so no KB file can be inside it", where=above,
            action="pass --kb the path of a KB file in a folder (or fix KB_MCP_KB / KB_MCP_HOME, which name it when "
            "--kb is not given)",
        )
    return None


def missing_error(kb_path: Path, remains: list[str], *, disappeared: bool = False) -> KBMissingError:
    """The error for a KB file that is not there, saying what is."""
    if not remains:
        return KBMissingError(f"no KB file at {kb_path}", where=kb_path,
                              action=f"create one with `kb-mcp --kb {kb_path} kb init` (or pass --kb PATH)")
    if kb_path.exists():  # an empty file: cut to nothing by something other than kb-mcp, which never writes one
        what, how = "is empty (0 bytes)", "it was cut to nothing by another program or a crash of the file system"
    else:
        what, how = "disappeared while in use" if disappeared else "is missing", "it was deleted or moved"
    return KBMissingError(
        f"the KB file {kb_path} {what}, but {'; '.join(remains)} remain: {how}, and kb-mcp does "
        "not start an empty KB in its place",
        where=kb_path,
        action=restore_hint(kb_path) if backups.list_backups(kb_path) else
        f"if the file was moved, pass its new path with --kb; to start a new, empty KB here anyway, run "
        f"`kb-mcp --kb {kb_path} kb init`",
    )


def damaged_file_hint(kb_path: Path) -> str:
    """What to do with a KB file that cannot be read (not JSON, empty, cut): restore a backup, and
    where there is none, start a new KB beside it (`kb repair` needs a readable KB file)."""
    if backups.list_backups(kb_path):
        return restore_hint(kb_path)
    return (f"no backup of it exists (one is kept at each compaction) and `kb repair` needs a readable KB file: "
            f"move it aside (`mv {kb_path} {kb_path}.damaged`) and start a new KB with `kb-mcp --kb {kb_path} kb init`")


def restore_hint(kb_path: Path) -> str:
    """What to do with a KB whose file or journal was lost: restore a backup, else salvage the journal."""
    if backups.list_backups(kb_path):
        return (f"restore the newest backup with `kb-mcp --kb {kb_path} kb restore` (with its journal it is the "
                f"whole KB), or pick one from `kb-mcp --kb {kb_path} kb restore --list`")
    return (f"no backup of it exists yet (one is kept at each compaction); `kb-mcp --kb {kb_path} kb repair` salvages "
            "what it can")


_SEQ_RE = re.compile(rb'"applied_seq":\s*(-?\d+)')


def head_seq(path: Path) -> int | None:
    """The applied_seq written near the start of the KB file (the meta table is written first).

    Inode, size and mtime alone can repeat: ext4 hands a freed inode to the next new file, and
    mtime has the clock tick's granularity. The sequence grows with every rewrite, so comparing
    it as well tells a replaced file apart from the one cached.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return None
    m = _SEQ_RE.search(head)
    return int(m.group(1)) if m else None


def new_meta() -> dict[str, Any]:
    """The meta record of a freshly created KB file."""
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "applied_seq": 0,
        "kb_id": uuid.uuid4().hex,
        "created_at": utcnow().isoformat(),
    }


@dataclass(frozen=True)
class JournalGap:
    """A journal line that does not continue the KB: out of sequence, or not where its writer put it."""

    offset: int
    seq: int
    expected: int
    written_at: int | None = None  # where the line's writer put it, when that is not where it is


def damaged_line_error(kb_path: Path, bad: journal.BadLine) -> KBCorruptError:
    """The KB refused for a damaged journal line; a copy of the journal is kept aside."""
    journal_path = journal_of(kb_path)
    line = journal.line_number(journal_path, bad.offset)
    copy, kept = keep_damaged_copy(journal_path)
    return KBCorruptError(
        f"{journal_path}: line {line} (byte offset {bad.offset}) is damaged: {bad.reason}. The KB is refused "
        f"rather than read without that line and every line after it; {kept}",
        where=journal_path, line=line, offset=bad.offset, copy=copy,
        action=f"run `kb-mcp --kb {kb_path} kb repair` to salvage every valid transaction into a new KB file",
    )

def refuse_newer_lines(journal_path: Path, found: journal.Salvage) -> None:
    """Raises KBNewerFormatError naming the first entry of a salvaged journal that holds an op a newer
    kb-mcp wrote: what replaces or rewrites the journal (`kb repair`, `kb restore`) refuses rather than
    leave such a line out as damage."""
    for offset, line, entry in found.entries:
        newer = newer_op(entry.ops)
        if newer is not None:
            raise newer.located(journal_path, line=line, offset=offset, writer=entry.by)


def gap_error(kb_path: Path, gap: JournalGap) -> KBCorruptError:
    """The KB refused for a journal line out of sequence or out of place; a copy is kept aside."""
    journal_path = journal_of(kb_path)
    line = journal.line_number(journal_path, gap.offset)
    copy, kept = keep_damaged_copy(journal_path)
    if gap.written_at is not None:
        what = (f"was written at byte offset {gap.written_at} but is at {gap.offset}: bytes before it were cut "
                "out or added")
    else:
        what = (f"holds transaction {gap.seq} where {gap.expected} was expected: the journal does not continue the "
                f"KB file {kb_path} (transactions are missing, or the file and journal come from different "
                "copies)")
    return KBCorruptError(
        f"{journal_path}: line {line} (byte offset {gap.offset}) {what}; {kept}",
        where=journal_path, line=line, offset=gap.offset, copy=copy,
        action=f"run `kb-mcp --kb {kb_path} kb repair` to salvage what both hold, or restore a backup "
        f"(`kb-mcp --kb {kb_path} kb restore --list`)",
    )
