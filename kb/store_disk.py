"""The KB store's files: the tables of one KB file cached in memory, kept current with the file and its
journal, and each commit written to them durably (`kb.store` builds reads and transactions on it).

* Every transaction appends one checksummed, fsynced line to a journal beside the file (see
  `kb.journal`): that line is the commit. When the journal has grown to a quarter of the file (at
  least `compact_min_bytes`), or a transaction is large, the whole KB is then written to a temp file,
  fsynced, and moved over the TinyDB file with ``os.replace`` (a reader sees the old file or the new
  one, never a mix), a copy of the new file is kept as a rotated backup (`kb.backups`), and only then
  does the journal start empty: the newest backup plus the journal is the whole KB at every instant.
* Reads need no lock: they compare the file's and the journal's identity (inode, size, mtime)
  with what is cached, re-read the TinyDB file only when it was replaced, and read only the
  journal lines appended since last time.
* A damaged journal line, a sequence gap or a vanished journal makes the store refuse the KB
  (KBCorruptError naming the file, line and byte offset); a line or file a newer kb-mcp wrote too, as
  KBNewerFormatError (upgrade kb-mcp; nothing is copied or changed); a read-only KB is never written
  (KBReadOnlyError); a writer whose lock file was deleted under it writes nothing (KBConflictError).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from pathlib import Path

from kb_mcp.kb import backups, journal, paths
from kb_mcp.kb.errors import (
    EnvironmentFault,
    KBConflictError,
    KBCorruptError,
    KBFileError,
    KBNewerFormatError,
    KBReadOnlyError,
    storage_error,
)
from kb_mcp.kb.files import (
    AtomicJSONStorage,
    JournalGap,
    damaged_file_hint,
    damaged_line_error,
    gap_error,
    head_seq,
    journal_of,
    missing_error,
    mode_of,
    read_from,
    restore_hint,
    what_remains,
)
from kb_mcp.kb.journal import Entry, FileId
from kb_mcp.kb.lock import KBLock
from kb_mcp.kb.models import SCHEMA_VERSION
from kb_mcp.kb.ops import KBOp
from kb_mcp.kb.tables import LayoutError, Tables

__all__ = ["COMPACT_MIN_BYTES", "KBFiles"]

log = logging.getLogger(__name__)

COMPACT_MIN_BYTES = 1 << 20
"""Journal size below which the store never compacts (a small KB would otherwise be rewritten often)."""


class KBFiles:
    """One KB file and its journal, cached as `Tables`: brought up to date by `refresh`, written by
    `_commit` (a journal line, or the whole file at compaction). Callers hold `_mutex`, and the KB
    lock to write."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lock_timeout: float | None = None,
        compact_min_bytes: int = COMPACT_MIN_BYTES,
        compact_fraction: float = 0.25,
        backups: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.journal_path = journal_of(self.path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.pending_dir = paths.pending_dir(self.path)
        self.compact_min_bytes = compact_min_bytes
        self.compact_fraction = compact_fraction  # compact when the journal reaches this share of the file
        self.keep_backups = _default_backups() if backups is None else backups
        self._mode, self._gid = mode_of(self.path)
        self._storage = AtomicJSONStorage(self.path)
        self.lock = KBLock(self.path, lock_timeout, mode=self._mode)
        self._mutex = threading.RLock()  # guards the cached tables between this process's threads
        self._tables: Tables | None = None
        self._base_id: FileId | None = None
        self._base_seq = 0  # applied_seq of the loaded TinyDB file
        self._last_seq = 0  # last journal entry applied to the cached tables
        self._j_ino: int | None = None
        self._j_offset = 0  # end of the last complete journal entry read
        self._j_starts: deque[int] = deque(maxlen=64)  # offsets of the last lines read (see _read_journal)

    # ---- locking and freshness -------------------------------------------------------------------

    def _locked(self, timeout: float | None = None) -> contextlib.AbstractContextManager[None]:
        return self.lock.held(timeout)

    def _load_base(self, base_id: FileId) -> None:
        self._tables = None
        try:
            data = self._storage.read()
        except ValueError as exc:  # not JSON: its syntax, a NaN or an infinity (jsontext), bytes not UTF-8
            raise KBCorruptError(f"{self.path}: not valid JSON ({exc}); the file is left as it is", where=self.path,
                                 action=damaged_file_hint(self.path)) from exc
        except OSError as exc:
            raise storage_error(exc, "read the KB file", self.path) from exc
        if data is None:
            raise KBCorruptError(f"{self.path}: the KB file is empty", where=self.path,
                                 action=damaged_file_hint(self.path))
        try:
            tables = Tables.from_tinydb(data, str(self.path))
        except LayoutError as exc:
            raise KBFileError(f"{exc}; not a kb-mcp KB file, left untouched", where=self.path,
                              action="pass the path of a kb-mcp KB with --kb (or $KB_MCP_KB)") from exc
        self._mode, self._gid = mode_of(self.path)
        self._tables = tables
        self._base_id = base_id
        self._base_seq = self._last_seq = int(tables.meta.get("applied_seq", 0))
        self._j_ino = None
        self._j_offset = 0
        self._j_starts.clear()

    def refresh(self) -> Tables:
        """Brings the cached tables up to date with the file and journal (callers hold `_mutex`)."""
        with self._mutex:
            gap: JournalGap | None = None
            for _ in range(20):
                base_id = FileId.of(self.path)
                if base_id is None:
                    self._tables = None
                    raise missing_error(self.path, what_remains(self.path), disappeared=True)
                if self._tables is None or base_id != self._base_id or self._head_changed():
                    self._load_base(base_id)
                state = self._read_journal()
                if state is True and FileId.of(self.path) == self._base_id:
                    assert self._tables is not None
                    return self._tables
                if isinstance(state, JournalGap):
                    if gap is not None and FileId.of(self.path) == self._base_id:
                        raise gap_error(self.path, state)  # the same file twice: no compaction explains it
                    gap = state
                self._tables = None  # replaced under us (a compaction): start over
            raise KBFileError(
                f"{self.path}: the KB file was replaced 20 times while this process read it",
                where=self.path,
                action="another program may be rewriting the KB file in a loop (a sync tool?): stop it, "
                "then call again",
            )

    def _head_changed(self) -> bool:
        head = head_seq(self.path)
        return head is not None and head != self._base_seq

    def _read_journal(self) -> bool | JournalGap:
        """Applies new journal entries. False when the cache must be rebuilt from the file, a JournalGap
        when the journal does not continue the loaded file; raises KBCorruptError for damage."""
        jid = FileId.of(self.journal_path)
        if jid is None:
            if self._j_ino is None:
                return True  # no journal yet (a KB from before journals)
            if FileId.of(self.path) == self._base_id and self._last_seq > self._base_seq:
                raise KBCorruptError(
                    f"{self.journal_path}: the KB journal was deleted; it held the transactions "
                    f"{self._base_seq + 1}..{self._last_seq}, committed after the KB file was last written",
                    where=self.journal_path, action=restore_hint(self.path),
                )
            return False  # a journal we had read vanished: the file was compacted
        if self._j_ino is not None and jid.ino != self._j_ino:
            return False  # a new journal: the file was compacted since we loaded it
        if jid.size < self._j_offset:
            log.error("%s: the KB journal shrank from %d to %d bytes: something other than kb-mcp cut it, and the "
                      "transactions after that point are gone", self.journal_path, self._j_offset, jid.size)
            return False
        if self._j_ino is None or jid.size > self._j_offset:
            chunk = journal.read_entries(self.journal_path, self._j_offset)
            assert self._tables is not None
            for start, entry in chunk.entries:
                starts = self._j_starts
                starts.append(start)
                if entry.at is not None and entry.at != start:
                    if entry.at < start and entry.at in starts:
                        continue  # lost a race with a writer that held no lock; its writer reported it uncommitted
                    return JournalGap(start, entry.seq, self._last_seq + 1, entry.at)  # bytes before it cut or added
                if entry.seq <= self._last_seq:
                    continue  # already folded into the file (a crash before the journal was emptied)
                if entry.seq != self._last_seq + 1:
                    return JournalGap(start, entry.seq, self._last_seq + 1)
                try:
                    self._tables.replay(entry.ops)
                except KBNewerFormatError as exc:  # not damage: no copy is kept, no repair is offered
                    self._tables = None
                    raise journal.newer_at(self.journal_path, start, exc, entry.by) from None
                except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
                    self._tables = None
                    raise damaged_line_error(self.path,
                        journal.BadLine(start, 0, f"entry {entry.seq} is malformed ({type(exc).__name__}: {exc})")
                    ) from exc
                self._last_seq = entry.seq
            self._j_offset = chunk.end
            self._j_ino = jid.ino
            if chunk.bad is not None:
                self._tables = None
                raise damaged_line_error(self.path, chunk.bad)
        return True

    # ---- writing ---------------------------------------------------------------------------------

    def _check_writable(self, *, folder: bool = False) -> None:
        """Refuses to write a read-only KB (the mode counts even for root). The journal is checked
        where it is opened for an append; it and the folder (`folder`) before a compaction replaces
        the file and the journal."""
        paths_: tuple[tuple[str, Path], ...] = (("KB file", self.path),)
        if folder:
            paths_ += (("KB journal", self.journal_path), ("KB's folder", self.path.parent))
        for what, path in paths_:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            if path == self.path:  # new files follow the KB file's mode as it is now (a chmod counts)
                self._mode, self._gid = st.st_mode & 0o777, st.st_gid
            if not st.st_mode & 0o222 or (os.geteuid() != 0 and not os.access(path, os.W_OK)):
                raise KBReadOnlyError(
                    f"the {what} {path} is read-only (mode {st.st_mode & 0o7777:04o}); kb-mcp does not write a "
                    "read-only KB",
                    where=path,
                    action=f"to record into this KB, make it writable (`chmod u+w {path}`); "
                    "read-only, it still answers suggestions",
                )

    def _commit(self, ops: list[KBOp]) -> None:
        """Commits `ops` as the next transaction: one journal line, then a compaction when the journal
        has grown or the transaction is large. The line is the commit: a compaction that fails after it
        is logged, and the transaction stands (it is in the journal)."""
        base_size = self._base_id.size if self._base_id else 0
        threshold = max(self.compact_min_bytes, int(base_size * self.compact_fraction))
        fold = len(ops) > 2000 or self._j_offset >= threshold
        if fold:
            self._check_writable(folder=True)  # a read-only folder refuses the transaction, not its compaction
        self._append(self._last_seq + 1, ops)
        if fold:
            try:
                self._write_base()
            except (EnvironmentFault, OSError) as exc:  # a later transaction compacts again
                log.warning("%s: transaction %d is committed in the journal, but the KB was not compacted: %s",
                            self.path, self._last_seq, exc)

    def _append(self, seq: int, ops: list[KBOp]) -> None:
        """Appends transaction `seq` to the journal, durably (the caller holds the KB lock)."""
        with self.lock.writing():
            self._append_line(seq, ops)

    def _append_line(self, seq: int, ops: list[KBOp]) -> None:
        try:
            end, ino = journal.append_entry(self.journal_path, Entry(seq, [op.wire() for op in ops]), self._j_offset,
                                            expected_ino=self._j_ino, mode=self._mode)
        except (KBConflictError, KBReadOnlyError):
            self._tables = None
            raise
        except OSError as exc:
            self._tables = None
            raise storage_error(exc, "append to the KB journal", self.journal_path) from exc
        if FileId.of(self.path) != self._base_id:
            self._tables = None
            raise KBConflictError(
                f"{self.path}: the KB file was replaced while this transaction was written to the journal, by a "
                "process that did not hold the KB lock (was the lock file deleted?). "
                "This transaction was not committed",
                where=self.path, action="call again; never delete the lock file of a KB in use",
            )
        self._j_ino = ino
        self._j_offset = end
        self._last_seq = seq

    def _write_base(self) -> OSError | None:
        """Compacts: writes the cached tables (every transaction up to `_last_seq`, each already in the
        journal) as the new KB file, keeps a backup of it, and only then empties the journal.

        So the newest backup plus the journal is the whole KB at every instant: a process killed
        between the new file and its backup leaves the journal whole, and a backup that cannot be
        made (returned; logged) leaves the journal as it is until a later compaction makes one.
        """
        assert self._tables is not None
        seq = self._last_seq
        self._check_writable(folder=True)
        self._tables.meta["applied_seq"] = seq
        self._tables.meta["schema_version"] = SCHEMA_VERSION
        try:
            tmp = self._storage.write_temp(self._tables.to_tinydb(), self._mode, self._gid)
        except OSError as exc:
            self._tables = None
            raise storage_error(exc, "write the KB file", self.path) from exc
        try:
            # one write from the journal's check to its emptying: no other writer's line can come between
            with self.lock.writing():
                return self._install_base(tmp, seq)
        except BaseException:
            tmp.unlink(missing_ok=True)  # nothing to do once it replaced the file
            self._tables = None  # re-read from the files what this compaction left there
            raise

    def _install_base(self, tmp: Path, seq: int) -> OSError | None:
        """Moves the compacted file `tmp` (holding transactions up to `seq`) over the KB file, keeps its
        backup and empties the journal (the caller holds the write gate, `KBLock.writing`)."""
        self._assert_journal_unchanged()
        try:
            os.replace(tmp, self.path)
        except OSError as exc:
            raise storage_error(exc, "replace the KB file", self.path) from exc
        journal.fsync_dir(self.path.parent)
        self._base_id = FileId.of(self.path)
        self._base_seq = seq  # the journal's lines, all folded now, are skipped by every reader
        for pattern in (f"{self.path.name}.tmp-*", f"{self.journal_path.name}.tmp-*"):
            for orphan in self.path.parent.glob(pattern):
                orphan.unlink(missing_ok=True)  # temp files of writers killed mid-write (we hold the lock)
        try:
            backups.make_backup(self.path, seq, self.keep_backups, self._mode, self._gid)
        except OSError as exc:
            log.warning("%s: compacted, but no backup could be kept in %s (%s); the journal is kept until one can be, "
                        "so that the newest backup and the journal still hold every transaction", self.path,
                        paths.backups_dir(self.path), exc)
            return exc
        try:
            journal.reset(self.journal_path, self._mode, self._gid)
        except OSError as exc:  # the cache is re-read from the file; the journal's lines are all folded into it
            raise storage_error(exc, "empty the KB journal", self.journal_path) from exc
        jid = FileId.of(self.journal_path)
        self._j_ino = jid.ino if jid else None
        self._j_offset = 0
        return None

    def _assert_journal_unchanged(self) -> None:
        """Before a compaction replaces the file: the journal holds nothing this process has not read."""
        jid = FileId.of(self.journal_path)
        if jid is None:
            if self._j_ino is None:
                return
            what = "was deleted"
        elif self._j_ino is not None and jid.ino != self._j_ino:
            what = "was replaced"
        elif jid.size < self._j_offset:
            what = "shrank"
        elif jid.size > self._j_offset and b"\n" in read_from(self.journal_path, self._j_offset):
            what = "holds entries this process did not read"
        else:
            return
        raise KBConflictError(
            f"{self.journal_path}: the KB journal {what} while this process held the KB lock: another process wrote "
            "without it (was the lock file deleted?). The KB was not compacted and this transaction was not committed",
            where=self.journal_path, action="call again; never delete the lock file of a KB in use",
        )



def _default_backups() -> int:
    return backups.default_keep()
