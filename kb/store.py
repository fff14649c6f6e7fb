"""The KB store: a TinyDB JSON file shared by several server processes, safe against lost updates
and torn files.

* Every read-modify-write runs in ``store.transaction()``: a cross-process file lock is taken, the
  KB is re-read inside it (other processes may have written), the block edits it, and the change
  is made durable before the lock is released.
* Small transactions append one fsynced line to a journal beside the file (see `kb.journal`);
  when the journal has grown to a quarter of the file (at least `compact_min_bytes`), or a
  transaction is large, the whole KB is written to a temp file, fsynced, and moved over the
  TinyDB file with ``os.replace`` (so a reader sees the old file or the new one, never a mix),
  and the journal starts empty.
* Reads need no lock: they compare the file's and the journal's identity (inode, size, mtime)
  with what is cached, re-read the TinyDB file only when it was replaced, and read only the
  journal lines appended since last time.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import filelock
from tinydb.storages import Storage

from kb_mcp.kb import journal, paths
from kb_mcp.kb.journal import Entry, FileId
from kb_mcp.kb.models import ALL_ARCH, SCHEMA_VERSION, CandidateRecord, Lesson, Optimization, Outcome, Score, State, Track, Transition, utcnow
from kb_mcp.kb.tables import FORMAT, LayoutError, Tables
from kb_mcp.kb.view import KBStats, KBView, Transaction

T = TypeVar("T")

COMPACT_MIN_BYTES = 1 << 20
"""Journal size below which the store never compacts (a small KB would otherwise be rewritten often)."""


class KBFileError(Exception):
    """The KB file cannot be used (corrupt, foreign, newer schema, unreadable, lock timeout).

    The message names the file. The store never overwrites a file it refused.
    """


class AtomicJSONStorage(Storage):
    """TinyDB storage that never leaves a torn file: write to a temp file, fsync, ``os.replace``.

    TinyDB's own JSONStorage truncates and rewrites in place, so a crash mid-write would leave
    half a file; this one can be handed to ``TinyDB(path, storage=AtomicJSONStorage)`` as well.
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
            return json.loads(raw)
        finally:
            if enabled:
                gc.enable()

    def write(self, data: dict[str, dict[str, Any]]) -> None:
        """Replaces the file atomically and durably with `data`."""
        blob = json.dumps(data, separators=(",", ":")).encode()
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(tmp, self.path)
        journal.fsync_dir(self.path.parent)

    def close(self) -> None:
        """Nothing is held open between calls."""


class KBStore:
    """One KB file: typed reads, and transactions for every change. Thread-safe and process-safe."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lock_timeout: float = 120.0,
        compact_min_bytes: int = COMPACT_MIN_BYTES,
        compact_fraction: float = 0.25,
    ) -> None:
        self.path = Path(path)
        self.journal_path = self.path.with_name(self.path.name + ".journal")
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.compact_min_bytes = compact_min_bytes
        self.compact_fraction = compact_fraction  # compact when the journal reaches this share of the file
        self._storage = AtomicJSONStorage(self.path)
        self._flock = filelock.FileLock(str(self.lock_path), timeout=lock_timeout)
        self._mutex = threading.RLock()  # guards the cached tables between this process's threads
        self._local = threading.local()  # the transaction open on this thread, if any
        self._tables: Tables | None = None
        self._base_id: FileId | None = None
        self._base_seq = 0  # applied_seq of the loaded TinyDB file
        self._last_seq = 0  # last journal entry applied to the cached tables
        self._j_ino: int | None = None
        self._j_offset = 0  # end of the last complete journal entry read

    # ---- opening -------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, *, seed: bool = True, **options: Any) -> KBStore:
        """Opens the KB at `path` (default: `kb.paths.resolve_kb_path()`), creating and seeding it
        when missing. Raises KBFileError for a corrupt, foreign or newer file, which stays untouched."""
        p = paths.resolve_kb_path(path)
        if p.is_dir():
            raise KBFileError(f"{p}: is a directory, not a KB file")
        store = cls(p, **options)
        if not p.exists() or p.stat().st_size == 0:
            if not seed:
                raise KBFileError(f"{p}: no KB file here (run `kb-mcp --kb {p} kb init` to create one)")
            store._create()
        store.refresh()
        return store

    def _create(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KBFileError(f"{self.path}: cannot create its folder: {exc}") from exc
        with self._locked():
            if self.path.exists() and self.path.stat().st_size > 0:
                return  # another process created it while we waited for the lock
            from kb_mcp.kb.seed import seed_tables

            tables = seed_tables()
            tables.meta = new_meta()
            self._storage.write(tables.to_tinydb())
            journal.reset(self.journal_path)

    # ---- locking and freshness -------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self._flock.acquire()
        except filelock.Timeout as exc:
            raise KBFileError(
                f"{self.path}: timed out after {self._flock.timeout:.0f} s waiting for the lock {self.lock_path} "
                "(another process holds it; if none is running, the lock file is stale and can be deleted)"
            ) from exc
        except OSError as exc:
            raise KBFileError(f"{self.path}: cannot take the lock {self.lock_path}: {exc}") from exc
        try:
            yield
        finally:
            self._flock.release()

    def _load_base(self, base_id: FileId) -> None:
        try:
            data = self._storage.read()
        except json.JSONDecodeError as exc:
            raise KBFileError(f"{self.path}: not valid JSON ({exc}); the file is left as it is") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise KBFileError(f"{self.path}: cannot read the KB file: {exc}") from exc
        if data is None:
            raise KBFileError(f"{self.path}: the KB file is empty")
        try:
            tables = Tables.from_tinydb(data, str(self.path))
        except LayoutError as exc:
            raise KBFileError(f"{exc}; not a kb-mcp KB file, left untouched") from exc
        version = tables.meta.get("schema_version")
        if version != SCHEMA_VERSION:
            newer = isinstance(version, int) and version > SCHEMA_VERSION
            raise KBFileError(
                f"{self.path}: KB schema version {version!r}, this kb-mcp reads version {SCHEMA_VERSION}"
                + (" (written by a newer kb-mcp: upgrade kb-mcp)" if newer else "")
            )
        self._tables = tables
        self._base_id = base_id
        self._base_seq = self._last_seq = int(tables.meta.get("applied_seq", 0))
        self._j_ino = None
        self._j_offset = 0

    def refresh(self) -> Tables:
        """Brings the cached tables up to date with the file and journal (callers hold `_mutex`)."""
        with self._mutex:
            for _ in range(20):
                base_id = FileId.of(self.path)
                if base_id is None:
                    raise KBFileError(f"{self.path}: the KB file disappeared")
                if self._tables is None or base_id != self._base_id or self._head_changed():
                    self._load_base(base_id)
                if self._read_journal() and FileId.of(self.path) == self._base_id:
                    assert self._tables is not None
                    return self._tables
                self._tables = None  # replaced under us (a compaction): start over
            raise KBFileError(f"{self.path}: the KB file keeps being replaced while reading it; try again")

    def _head_changed(self) -> bool:
        head = _head_seq(self.path)
        return head is not None and head != self._base_seq

    def _read_journal(self) -> bool:
        """Applies new journal entries; False when the cache must be rebuilt from the file."""
        jid = FileId.of(self.journal_path)
        if jid is None:
            return self._j_ino is None  # a journal we had read vanished: the file was compacted
        if self._j_ino is not None and jid.ino != self._j_ino:
            return False  # a new journal: the file was compacted since we loaded it
        if jid.size < self._j_offset:
            return False
        if self._j_ino is None or jid.size > self._j_offset:
            entries, offset = journal.read_entries(self.journal_path, self._j_offset)
            assert self._tables is not None
            for entry in entries:
                if entry.seq <= self._last_seq:
                    continue  # already folded into the file (a crash before the journal was emptied)
                if entry.seq != self._last_seq + 1:
                    return False  # a gap: this journal does not continue our file version
                try:
                    self._tables.apply_all(entry.ops)
                except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
                    self._tables = None
                    raise KBFileError(
                        f"{self.journal_path}: entry {entry.seq} is malformed ({type(exc).__name__}: {exc}); "
                        "the KB journal was edited or damaged by something other than kb-mcp"
                    ) from exc
                self._last_seq = entry.seq
            self._j_offset = offset
            self._j_ino = jid.ino
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
    def transaction(self) -> Iterator[Transaction]:
        """Locks the KB across processes, yields an up-to-date Transaction, commits on exit.

        Nested use on one thread joins the open transaction. If the block raises, nothing is
        written and the cache is rebuilt from disk on the next access.
        """
        current: Transaction | None = getattr(self._local, "tx", None)
        if current is not None:
            yield current
            return
        with self._locked(), self._mutex:
            tx = Transaction(self.refresh())
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

    def _commit(self, ops: list[Any]) -> None:
        seq = self._last_seq + 1
        base_size = self._base_id.size if self._base_id else 0
        threshold = max(self.compact_min_bytes, int(base_size * self.compact_fraction))
        if len(ops) > 2000 or self._j_offset >= threshold:
            self._write_base(seq)
            return
        try:
            self._j_offset = journal.append_entry(self.journal_path, Entry(seq, ops), self._j_offset)
        except OSError as exc:
            self._tables = None
            raise KBFileError(f"{self.journal_path}: cannot append to the KB journal: {exc}") from exc
        jid = FileId.of(self.journal_path)
        self._j_ino = jid.ino if jid else None
        self._last_seq = seq

    def _write_base(self, seq: int) -> None:
        assert self._tables is not None
        self._tables.meta["applied_seq"] = seq
        self._tables.meta["schema_version"] = SCHEMA_VERSION
        try:
            self._storage.write(self._tables.to_tinydb())
            journal.reset(self.journal_path)
        except OSError as exc:
            self._tables = None
            raise KBFileError(f"{self.path}: cannot write the KB file: {exc}") from exc
        self._base_id = FileId.of(self.path)
        self._base_seq = self._last_seq = seq
        jid = FileId.of(self.journal_path)
        self._j_ino = jid.ino if jid else None
        self._j_offset = 0
        for pattern in (f"{self.path.name}.tmp-*", f"{self.journal_path.name}.tmp-*"):
            for orphan in self.path.parent.glob(pattern):
                orphan.unlink(missing_ok=True)  # temp files of writers killed mid-write (we hold the lock)

    def compact(self) -> None:
        """Folds the journal into the TinyDB file now (export and `kb init` do this)."""
        with self._locked(), self._mutex:
            self.refresh()
            if self._last_seq != self._base_seq or FileId.of(self.journal_path) is None:
                self._write_base(self._last_seq + 1)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """The whole KB in TinyDB layout (the journal folded in), e.g. for export."""
        with self._mutex:
            data = self.refresh().to_tinydb()
            return json.loads(json.dumps(data))  # a deep copy the caller may keep or edit


_SEQ_RE = re.compile(rb'"applied_seq":\s*(-?\d+)')


def _head_seq(path: Path) -> int | None:
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
