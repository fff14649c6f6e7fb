"""The KB store: a TinyDB JSON file shared by several server processes, safe against lost updates,
torn files and damaged journals.

* Every read-modify-write runs in ``store.transaction()``: the cross-process KB lock (`kb.lock`) is
  taken, the KB is re-read inside it (other processes may have written), the block edits it, and
  the change is made durable before the lock is released.
* Small transactions append one checksummed, fsynced line to a journal beside the file (see
  `kb.journal`); when the journal has grown to a quarter of the file (at least `compact_min_bytes`),
  or a transaction is large, the whole KB is written to a temp file, fsynced, and moved over the
  TinyDB file with ``os.replace`` (a reader sees the old file or the new one, never a mix), the
  journal starts empty, and a copy of the new file is kept as a rotated backup (`kb.backups`).
* Reads need no lock: they compare the file's and the journal's identity (inode, size, mtime)
  with what is cached, re-read the TinyDB file only when it was replaced, and read only the
  journal lines appended since last time.
* Nothing committed is dropped quietly. A damaged journal line, a sequence gap or a vanished
  journal makes the store refuse the KB (KBCorruptError naming the file, line and byte offset, with
  a copy of the journal kept) until ``kb-mcp kb repair`` salvages it; a missing KB file is never
  re-created over what is left of it (KBMissingError); a read-only KB is never written
  (KBReadOnlyError); a writer whose lock file was deleted under it writes nothing (KBConflictError).
* A record that must not be lost while the lock is busy (a finished verification) is persisted
  first and committed by the next transaction of any process (`commit_soon`, `kb.pending`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from kb_mcp.kb import backups, journal, paths, pending
from kb_mcp.kb.errors import (
    KBConflictError,
    KBCorruptError,
    KBFileError,
    KBLockTimeout,
    KbMcpError,
    KBReadOnlyError,
    storage_error,
)
from kb_mcp.kb.files import (
    AtomicJSONStorage,
    JournalGap,
    damaged_line_error,
    gap_error,
    has_content,
    head_seq,
    journal_of,
    missing_error,
    mode_of,
    new_meta,
    read_from,
    restore_hint,
    what_remains,
)
from kb_mcp.kb.journal import Entry, FileId
from kb_mcp.kb.lock import KBLock
from kb_mcp.kb.models import (
    ALL_ARCH,
    SCHEMA_VERSION,
    CandidateRecord,
    Lesson,
    Optimization,
    Outcome,
    Score,
    State,
    Track,
    Transition,
)
from kb_mcp.kb.ops import KBOp
from kb_mcp.kb.tables import LayoutError, Tables
from kb_mcp.kb.view import KBStats, KBView, Transaction

__all__ = ["AtomicJSONStorage", "COMPACT_MIN_BYTES", "KBFileError", "KBStore", "new_meta", "what_remains"]

log = logging.getLogger(__name__)

T = TypeVar("T")

COMPACT_MIN_BYTES = 1 << 20
"""Journal size below which the store never compacts (a small KB would otherwise be rewritten often)."""

_FLUSH_RETRY_S = 2.0  # pause between attempts of the thread that commits pending records


class KBStore:
    """One KB file: typed reads, and transactions for every change. Thread-safe and process-safe."""

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
        self._local = threading.local()  # the transaction open on this thread, if any
        self._tables: Tables | None = None
        self._base_id: FileId | None = None
        self._base_seq = 0  # applied_seq of the loaded TinyDB file
        self._last_seq = 0  # last journal entry applied to the cached tables
        self._j_ino: int | None = None
        self._j_offset = 0  # end of the last complete journal entry read
        self._j_starts: deque[int] = deque(maxlen=64)  # offsets of the last lines read (see _read_journal)
        self._flusher: threading.Thread | None = None

    # ---- opening -------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, *, create: bool = True, **options: Any) -> KBStore:
        """Opens the KB at `path` (default: `kb.paths.resolve_kb_path()`).

        A missing KB is created and seeded only when `create` is set and nothing of a KB is at
        that path (no journal, artifacts or backups); otherwise KBMissingError says what is there
        and how to get the KB back. A corrupt, foreign or newer file raises KBFileError and stays
        untouched.
        """
        p = paths.resolve_kb_path(path)
        if p.is_dir():
            raise KBFileError(f"{p}: is a directory, not a KB file", where=p,
                              action="pass the path of the KB file itself (e.g. .../kb.json)")
        store = cls(p, **options)
        if not has_content(p):
            remains = what_remains(p)
            if remains or not create:
                raise missing_error(p, remains)
            store.create()
        store.refresh()
        return store

    def create(self, *, mode: int = paths.PRIVATE_FILE_MODE, gid: int = -1) -> bool:
        """Creates and seeds the KB file with `mode` (and group `gid`); False when another process
        created it first. Callers decide whether creating is right (see `open`)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, "create the KB's folder", self.path.parent) from exc
        self._mode, self._gid = mode, gid
        self.lock = KBLock(self.path, self.lock.timeout, mode=mode)
        with self._locked(), self._mutex:
            if has_content(self.path):
                return False  # another process created it while we waited for the lock
            from kb_mcp.kb.seed import seed_tables

            tables = seed_tables()
            tables.meta = new_meta()
            try:
                tmp = self._storage.write_temp(tables.to_tinydb(), mode, gid)
                os.replace(tmp, self.path)
                journal.fsync_dir(self.path.parent)
                journal.reset(self.journal_path, mode, gid)
            except OSError as exc:
                raise storage_error(exc, "create the KB file", self.path) from exc
            self._tables = None
            return True

    # ---- locking and freshness -------------------------------------------------------------------

    def _locked(self, timeout: float | None = None) -> contextlib.AbstractContextManager[None]:
        return self.lock.held(timeout)

    def _load_base(self, base_id: FileId) -> None:
        self._tables = None
        try:
            data = self._storage.read()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise KBCorruptError(f"{self.path}: not valid JSON ({exc}); the file is left as it is", where=self.path,
                                 action=restore_hint(self.path)) from exc
        except OSError as exc:
            raise storage_error(exc, "read the KB file", self.path) from exc
        if data is None:
            raise KBCorruptError(f"{self.path}: the KB file is empty", where=self.path, action=restore_hint(self.path))
        try:
            tables = Tables.from_tinydb(data, str(self.path))
        except LayoutError as exc:
            raise KBFileError(f"{exc}; not a kb-mcp KB file, left untouched", where=self.path,
                              action="pass the path of a kb-mcp KB with --kb (or $KB_MCP_KB)") from exc
        version = tables.meta.get("schema_version")
        if version != SCHEMA_VERSION:
            newer = isinstance(version, int) and version > SCHEMA_VERSION
            raise KBFileError(
                f"{self.path}: KB schema version {version!r}, this kb-mcp reads version {SCHEMA_VERSION}"
                + (" (written by a newer kb-mcp)" if newer else ""),
                where=self.path,
                action="upgrade kb-mcp" if newer else "open it with the kb-mcp version that wrote it and export it",
            )
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

    # ---- reading ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def read(self) -> Iterator[KBView]:
        """A consistent, up-to-date view for several reads (other threads wait while it is open)."""
        with self._mutex:
            yield KBView(self.refresh())

    def _view(self, fn: Callable[[KBView], T]) -> T:
        with self.read() as view:
            return fn(view)

    def get_state(self, state_id: str) -> State | None:
        """The state with this id, or None."""
        return self._view(lambda v: v.get_state(state_id))

    def list_states(self) -> list[State]:
        """Every state."""
        return self._view(lambda v: v.list_states())

    def get_optimization(self, optimization_id: str) -> Optimization | None:
        """The optimization with this id, or None."""
        return self._view(lambda v: v.get_optimization(optimization_id))

    def list_optimizations(self) -> list[Optimization]:
        """Every optimization."""
        return self._view(lambda v: v.list_optimizations())

    def get_score(self, state_id: str, optimization_id: str, arch: str = ALL_ARCH, track: str = "fp32") -> Score | None:
        """The score of (state, optimization, arch family, precision track)."""
        return self._view(lambda v: v.get_score(state_id, optimization_id, arch, Track(track)))

    def candidates(self, state_id: str, arch: str = ALL_ARCH, track: str = "fp32") -> list[Score]:
        """Applicable optimizations of a state with their per-arch (else pooled) scores on a track."""
        return self._view(lambda v: v.candidates(state_id, arch, Track(track)))

    def lessons(self, state_id: str, optimization_id: str, limit: int | None = None) -> list[Lesson]:
        """Lessons about an optimization in a state, newest first."""
        return self._view(lambda v: v.lessons(state_id, optimization_id, limit))

    def transitions(self, state_id: str, optimization_id: str | None = None) -> list[Transition]:
        """Transition counts out of a state."""
        return self._view(lambda v: v.transitions(state_id, optimization_id))

    def get_candidate(self, candidate_id: str) -> CandidateRecord | None:
        """The stored verdict on a candidate, or None."""
        return self._view(lambda v: v.get_candidate(candidate_id))

    def get_outcome(self, outcome_id: str) -> Outcome | None:
        """A replay-buffer entry, or None."""
        return self._view(lambda v: v.get_outcome(outcome_id))

    def stats(self) -> KBStats:
        """Counts of everything in the KB."""
        return self._view(lambda v: v.stats())

    # ---- writing ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, timeout: float | None = None) -> Iterator[Transaction]:
        """Locks the KB across processes, yields an up-to-date Transaction, commits on exit.

        Records waiting in the pending folder are committed with it. Nested use on one thread
        joins the open transaction. If the block raises, nothing is written and the cache is
        rebuilt from disk on the next access. `timeout` overrides the lock wait (seconds).
        """
        current: Transaction | None = getattr(self._local, "tx", None)
        if current is not None:
            yield current
            return
        with self._locked(timeout), self._mutex:
            tx = Transaction(self.refresh())
            self._check_writable()
            waiting = pending.read_all(self.pending_dir)
            for _, ops in waiting:
                tx.replay(ops)
            self._local.tx = tx
            try:
                yield tx
                if tx.ops:
                    self._commit(tx.ops)
            except BaseException:
                if tx.ops:
                    self._tables = None  # edits reached the cache but not the disk: drop them
                raise
            finally:
                self._local.tx = None
            if waiting:
                pending.remove([p for p, _ in waiting])  # committed; still under the lock

    def commit_soon(self, key: str, write: Callable[[Transaction], None], *, wait_s: float) -> bool:
        """Commits whole-record puts that must not be lost while the KB lock is busy.

        `write` makes the puts on a scratch transaction; they are persisted in the pending folder
        (durable on disk) before the lock is taken, then committed. True when committed now;
        False when the lock stayed busy for `wait_s`: a thread of this process commits them when
        it frees, and any transaction of any process commits them before its own work meanwhile.
        """
        self._check_writable()
        scratch = Transaction(Tables())
        write(scratch)
        try:
            pending.write(self.pending_dir, key, [op.wire() for op in scratch.ops], self._mode)
        except OSError as exc:
            raise storage_error(exc, "save a record for the KB in", self.pending_dir) from exc
        try:
            with self.transaction(timeout=wait_s):
                pass
        except KBLockTimeout as exc:
            log.warning("%s; %s waits in %s and is committed when the lock frees", exc.message, key, self.pending_dir)
            self._flush_later()
            return False
        return True

    def pending_count(self) -> int:
        """Records persisted but not yet committed (see `commit_soon`)."""
        return pending.count(self.pending_dir)

    def _flush_later(self) -> None:
        with self._mutex:
            if self._flusher is not None and self._flusher.is_alive():
                return
            self._flusher = threading.Thread(target=self._flush_pending, name="kb-pending-commit", daemon=True)
            self._flusher.start()

    def _flush_pending(self) -> None:
        pause = _FLUSH_RETRY_S
        while pending.count(self.pending_dir):
            try:
                with self.transaction():
                    pass
            except KBLockTimeout:
                continue  # still busy: wait again
            except KbMcpError as exc:  # e.g. a read-only or damaged KB: the records wait on disk meanwhile
                log.warning("%d pending KB record(s) in %s not committed yet: %s", pending.count(self.pending_dir),
                            self.pending_dir, exc)
                time.sleep(pause)
                pause = min(pause * 2, 300.0)

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
        seq = self._last_seq + 1
        base_size = self._base_id.size if self._base_id else 0
        threshold = max(self.compact_min_bytes, int(base_size * self.compact_fraction))
        if len(ops) > 2000 or self._j_offset >= threshold:
            self._write_base(seq)
            return
        self.lock.assert_held()
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

    def _write_base(self, seq: int) -> None:
        assert self._tables is not None
        self._check_writable(folder=True)
        self._tables.meta["applied_seq"] = seq
        self._tables.meta["schema_version"] = SCHEMA_VERSION
        try:
            tmp = self._storage.write_temp(self._tables.to_tinydb(), self._mode, self._gid)
        except OSError as exc:
            self._tables = None
            raise storage_error(exc, "write the KB file", self.path) from exc
        try:
            self.lock.assert_held()
            self._assert_journal_unchanged()
            os.replace(tmp, self.path)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)
            self._tables = None
            if isinstance(exc, OSError):
                raise storage_error(exc, "replace the KB file", self.path) from exc
            raise
        journal.fsync_dir(self.path.parent)
        try:
            # The new file holds every entry (their sequences are folded), so failing here loses nothing.
            journal.reset(self.journal_path, self._mode, self._gid)
        except OSError as exc:
            self._tables = None
            raise storage_error(exc, "empty the KB journal", self.journal_path) from exc
        self._base_id = FileId.of(self.path)
        self._base_seq = self._last_seq = seq
        jid = FileId.of(self.journal_path)
        self._j_ino = jid.ino if jid else None
        self._j_offset = 0
        for pattern in (f"{self.path.name}.tmp-*", f"{self.journal_path.name}.tmp-*"):
            for orphan in self.path.parent.glob(pattern):
                orphan.unlink(missing_ok=True)  # temp files of writers killed mid-write (we hold the lock)
        try:
            backups.make_backup(self.path, seq, self.keep_backups, self._mode, self._gid)
        except OSError as exc:
            log.warning("%s: compacted, but no backup could be kept in %s: %s", self.path,
                        paths.backups_dir(self.path), exc)

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

    def compact(self) -> None:
        """Folds the journal into the TinyDB file now (export, `kb backup` and `kb init` do this)."""
        with self._locked(), self._mutex:
            self.refresh()
            self._check_writable()
            if self._last_seq != self._base_seq or FileId.of(self.journal_path) is None:
                self._write_base(self._last_seq + 1)

    def backup(self) -> Path:
        """Compacts when the journal holds anything and keeps a backup of the file; returns it."""
        with self._locked(), self._mutex:
            self.refresh()
            self._check_writable()
            if self._last_seq != self._base_seq or FileId.of(self.journal_path) is None:
                self._write_base(self._last_seq + 1)
            else:
                try:
                    backups.make_backup(self.path, self._base_seq, max(1, self.keep_backups), self._mode, self._gid)
                except OSError as exc:
                    raise storage_error(exc, "keep a backup in", paths.backups_dir(self.path)) from exc
        newest = backups.list_backups(self.path)
        assert newest, "a backup was just written"
        return newest[0].path

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """The whole KB in TinyDB layout (the journal folded in), e.g. for export."""
        with self._mutex:
            data = self.refresh().to_tinydb()
            copy: dict[str, dict[str, Any]] = json.loads(json.dumps(data))  # the caller may keep or edit it
            return copy


def _default_backups() -> int:
    return backups.default_keep()
