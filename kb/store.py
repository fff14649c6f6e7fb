"""The KB store: a TinyDB JSON file shared by several server processes, safe against lost updates,
torn files and damaged journals.

* Every read-modify-write runs in ``store.transaction()``: the cross-process KB lock (`kb.lock`) is
  taken, the KB is re-read inside it (other processes may have written), the block edits it, and
  the change is made durable before the lock is released (the journal, compaction and lock-free
  reads are `kb.store_disk`'s).
* Nothing committed is dropped quietly. A damaged journal makes the store refuse the KB until
  ``kb-mcp kb repair`` salvages it; a missing KB file is never re-created over what is left of it
  (KBMissingError); a read-only KB is never written (KBReadOnlyError).
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from kb_mcp.kb import backups, journal, paths, pending
from kb_mcp.kb.errors import KBFileError, KBLockTimeout, KbMcpError, storage_error
from kb_mcp.kb.files import AtomicJSONStorage, has_content, missing_error, new_meta, path_error, what_remains
from kb_mcp.kb.journal import FileId
from kb_mcp.kb.lock import KBLock
from kb_mcp.kb.models import (
    ALL_ARCH,
    CandidateRecord,
    KBStats,
    Lesson,
    Optimization,
    Outcome,
    Score,
    State,
    Track,
    Transition,
)
from kb_mcp.kb.store_disk import COMPACT_MIN_BYTES, KBFiles
from kb_mcp.kb.tables import Tables
from kb_mcp.kb.view import KBView, Transaction

__all__ = ["AtomicJSONStorage", "COMPACT_MIN_BYTES", "KBFileError", "KBStore", "new_meta", "what_remains"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_FLUSH_RETRY_S = 2.0  # pause between attempts of the thread that commits pending records


class KBStore(KBFiles):
    """One KB file: typed reads, and transactions for every change. Thread-safe and process-safe."""

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        """`options`: those of `KBFiles` (lock_timeout, compact_min_bytes, compact_fraction, backups)."""
        super().__init__(path, **options)
        self._local = threading.local()  # the transaction open on this thread, if any
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
        unusable = path_error(p)
        if unusable is not None:
            raise unusable
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
        with self._locked(), self._mutex, self.lock.writing():
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

    # ---- compaction and backups -------------------------------------------------------------------

    def compact(self) -> None:
        """Folds the journal into the TinyDB file now (export, `kb backup` and `kb init` do this)."""
        with self._locked(), self._mutex:
            self.refresh()
            self._check_writable()
            if self._last_seq != self._base_seq or FileId.of(self.journal_path) is None:
                self._fold()

    def _fold(self) -> OSError | None:
        """Compacts now (the caller holds the lock): a file that holds the journal's last line (an
        empty transaction when there is none to fold) and its backup (see `KBFiles._write_base`)."""
        if self._last_seq == self._base_seq:
            self._append(self._last_seq + 1, [])  # the new file's sequence tells it from the old one
        return self._write_base()

    def backup(self) -> Path:
        """Compacts when the journal holds anything and keeps a backup of the file; returns it."""
        with self._locked(), self._mutex:
            self.refresh()
            self._check_writable()
            failed: OSError | None = None
            if self._last_seq != self._base_seq or FileId.of(self.journal_path) is None:
                failed = self._fold()
            else:
                try:
                    backups.make_backup(self.path, self._base_seq, max(1, self.keep_backups), self._mode, self._gid)
                except OSError as exc:
                    failed = exc
            if failed is not None:
                raise storage_error(failed, "keep a backup in", paths.backups_dir(self.path)) from failed
        newest = backups.list_backups(self.path)
        assert newest, "a backup was just written"
        return newest[0].path

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """The whole KB in TinyDB layout (the journal folded in), e.g. for export."""
        with self._mutex:
            data = self.refresh().to_tinydb()
            copy: dict[str, dict[str, Any]] = json.loads(json.dumps(data))  # the caller may keep or edit it
            return copy

