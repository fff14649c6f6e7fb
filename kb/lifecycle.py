"""A KB file's life beyond transactions: creating it, sharing it with a group, restoring a backup,
and repairing a damaged journal. `kb-mcp kb init|restore|repair|backup` call these.

Every step that replaces a file keeps what it replaces (``<name>.before-restore-<time>``,
``<name>.before-repair-<time>``), so none of them can lose data either.
"""

from __future__ import annotations

import grp
import os
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from kb_mcp.kb import backups, journal, paths
from kb_mcp.kb.atomic import temp_beside
from kb_mcp.kb.errors import CallerError, KBCorruptError, KBFileError, KbMcpError, KBNewerFormatError, storage_error
from kb_mcp.kb.files import (
    AtomicJSONStorage,
    damaged_file_hint,
    has_content,
    mode_of,
    path_error,
    refuse_newer_lines,
)
from kb_mcp.kb.lock import KBLock
from kb_mcp.kb.store import KBStore
from kb_mcp.kb.tables import LayoutError, Tables

__all__ = ["InitReport", "RepairReport", "RestoreReport", "init_kb", "repair_kb", "restore_kb", "share_with_group"]


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _keep(path: Path, dest: Path) -> Path:
    """Keeps the current version of `path` as `dest` (a hard link where the file system allows it)."""
    try:
        os.link(path, dest)
    except OSError:
        shutil.copy2(path, dest)
    return dest


def _group_id(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise CallerError(f"no group named {group!r} on this machine",
                          action="pass an existing group (see `getent group`), or create it first") from None


# ---- init and sharing ------------------------------------------------------------------------------


@dataclass
class InitReport:
    """What `init_kb` did."""

    store: KBStore
    created: bool
    notes: list[str] = field(default_factory=list)


def _usable(kb_path: Path) -> None:
    """Raises the KBFileError of a path no KB file can be at (see `files.path_error`)."""
    unusable = path_error(kb_path)
    if unusable is not None:
        raise unusable


def init_kb(kb_path: Path, *, group: str | None = None) -> InitReport:
    """Creates and seeds the KB at `kb_path` unless it exists; with `group`, the KB and its folders
    are (made) readable and writable by that group.

    An explicit init creates the KB even beside what is left of an earlier one (artifacts,
    backups); a journal left without its file is set aside first (its transactions belonged to
    that file), never folded into the new one.
    """
    notes: list[str] = []
    _usable(kb_path)
    if has_content(kb_path):
        store = KBStore.open(kb_path, create=False)
        if group:
            notes += share_with_group(kb_path, group)
        return InitReport(store, False, notes)
    gid = _group_id(group) if group else -1
    mode = paths.SHARED_FILE_MODE if group else paths.PRIVATE_FILE_MODE
    stray = kb_path.with_name(kb_path.name + ".journal")
    if has_content(stray):
        aside = stray.with_name(f"{stray.name}.orphaned-{_stamp()}")
        os.replace(stray, aside)
        notes.append(f"a journal without its KB file was set aside as {aside} (restore a backup to use it)")
    store = KBStore(kb_path)
    created = store.create(mode=mode, gid=gid)
    for folder in (paths.artifacts_dir(kb_path), paths.backups_dir(kb_path)):
        _make_folder(folder, mode, gid)
    if group:
        notes += share_with_group(kb_path, group)
    store.refresh()
    return InitReport(store, created, notes)


def _make_folder(folder: Path, file_mode: int, gid: int) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if gid >= 0:
            os.chown(folder, -1, gid)
        os.chmod(folder, paths.folder_mode(file_mode))
    except OSError as exc:
        raise storage_error(exc, "create the folder", folder) from exc


def share_with_group(kb_path: Path, group: str) -> list[str]:
    """Makes the KB, its journal, lock, artifacts and backups readable and writable by `group`
    (files 0660, folders 2770 so that new files inherit the group)."""
    gid = _group_id(group)
    changed = 0
    targets = [kb_path] + [kb_path.with_name(kb_path.name + s) for s in (".journal", ".lock", ".lock.holder")]
    for folder in (paths.artifacts_dir(kb_path), paths.backups_dir(kb_path)):
        if not folder.exists():
            _make_folder(folder, paths.SHARED_FILE_MODE, gid)
        targets.append(folder)
        for root, dirs, files in os.walk(folder):
            targets += [Path(root) / d for d in dirs] + [Path(root) / f for f in files]
    for path in targets:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if os.path.islink(path):
            continue
        try:
            os.chown(path, -1, gid)
            is_dir = os.path.isdir(path)
            os.chmod(path, paths.folder_mode(paths.SHARED_FILE_MODE) if is_dir else (st.st_mode & 0o777) | 0o660)
        except OSError as exc:
            raise storage_error(exc, f"give group {group} access to", path) from exc
        changed += 1
    return [f"{changed} files and folders of the KB are now shared with group {group} (files 0660, folders 2770)"]


# ---- restore ---------------------------------------------------------------------------------------


@dataclass
class RestoreReport:
    """What `restore_kb` did."""

    backup: Path
    applied_seq: int
    journal_kept: bool
    set_aside: list[Path] = field(default_factory=list)


def _load_tables(path: Path, kb_path: Path) -> Tables:
    """The tables of `path`: the KB file `kb_path` itself, or one of its backups."""
    try:
        data = AtomicJSONStorage(path).read()
        if data is None:
            raise ValueError("empty file")
        tables = Tables.from_tinydb(data, str(path))
    except (ValueError, LayoutError) as exc:
        raise KBCorruptError(f"{path}: not a readable kb-mcp KB file ({exc})", where=path,
                             action=f"choose another backup (`kb-mcp --kb {kb_path} kb restore --list`)") from exc
    except OSError as exc:
        raise storage_error(exc, "read", path) from exc
    return tables


def _refuse_newer_file(kb_path: Path) -> None:
    """Refuses to replace a KB file that a newer kb-mcp wrote (it is not damaged); one that is damaged or
    gone is what a restore is for."""
    try:
        _load_tables(kb_path, kb_path)
    except KBNewerFormatError:
        raise
    except KbMcpError:
        pass


def _journal_continues(tables: Tables, journal_path: Path) -> bool:
    """True when the journal reads cleanly on top of `tables` (a backup of the current file)."""
    if not journal_path.exists():
        return True
    chunk = journal.read_entries(journal_path, 0)
    if chunk.bad is not None:
        return False
    last = int(tables.meta.get("applied_seq", 0))
    for start, entry in chunk.entries:
        if entry.at is not None and entry.at != start:
            continue
        if entry.seq <= last:
            continue
        if entry.seq != last + 1:
            return False
        last = entry.seq
    return True


def restore_kb(kb_path: Path, backup: Path | None = None, *, lock_timeout: float | None = None) -> RestoreReport:
    """Puts a backup (default: the newest) in place of the KB file.

    The journal is kept when it continues that backup (the newest backup plus the journal is the
    whole KB: this brings back a deleted or damaged KB file without losing a transaction);
    otherwise it is set aside with the replaced KB file, and the KB is what the backup holds. A journal
    line or backup a newer kb-mcp wrote is refused (KBNewerFormatError) before anything is replaced.
    """
    _usable(kb_path)
    if backup is None:
        found = backups.list_backups(kb_path)
        if not found:
            raise KBFileError(f"no backups of {kb_path} in {paths.backups_dir(kb_path)}", where=kb_path,
                              action=f"backups are kept at each compaction and by `kb-mcp --kb {kb_path} kb "
                              f"backup`. Without one, `kb-mcp --kb {kb_path} kb repair` salvages a damaged journal; a "
                              f"damaged KB file cannot be mended: move it aside (`mv {kb_path} {kb_path}.damaged`) "
                              f"and start a new KB with `kb-mcp --kb {kb_path} kb init`")
        backup = found[0].path
    elif not backup.exists():
        candidate = paths.backups_dir(kb_path) / backup.name
        if not candidate.exists():
            raise CallerError(f"no backup {backup}", action=f"pick one from `kb-mcp --kb {kb_path} kb restore --list`")
        backup = candidate
    tables = _load_tables(backup, kb_path)
    seq = int(tables.meta.get("applied_seq", 0))
    journal_path = kb_path.with_name(kb_path.name + ".journal")
    mode, gid = mode_of(kb_path if kb_path.exists() else backup)
    aside: list[Path] = []
    lock = KBLock(kb_path, lock_timeout, mode=mode)
    with lock.held(), lock.writing():
        # a line of a newer kb-mcp is not to be set aside with a journal that does not continue the backup
        refuse_newer_lines(journal_path, journal.salvage(journal_path))
        _refuse_newer_file(kb_path)
        keep_journal = _journal_continues(tables, journal_path)
        stamp = _stamp()
        try:
            tmp = temp_beside(kb_path, hidden=False)
            shutil.copyfile(backup, tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                journal.set_mode(fd, mode, gid)
                os.fsync(fd)
            finally:
                os.close(fd)
            if kb_path.exists():
                aside.append(_keep(kb_path, kb_path.with_name(f"{kb_path.name}.before-restore-{stamp}")))
            os.replace(tmp, kb_path)
            journal.fsync_dir(kb_path.parent)
            if not keep_journal:
                old_journal = journal_path.with_name(f"{journal_path.name}.before-restore-{stamp}")
                os.replace(journal_path, old_journal)
                aside.append(old_journal)
                journal.reset(journal_path, mode, gid)
        except OSError as exc:
            raise storage_error(exc, "restore the KB file", kb_path) from exc
    KBStore.open(kb_path, create=False).stats()  # it loads, journal and all
    return RestoreReport(backup, seq, keep_journal, aside)


# ---- repair ----------------------------------------------------------------------------------------


@dataclass
class RepairReport:
    """What `repair_kb` found and salvaged."""

    kb_path: Path
    output: Path
    transactions: int = 0  # journal entries applied
    first_seq: int | None = None
    last_seq: int | None = None
    skipped_duplicates: int = 0  # already in the file, or written twice
    bad_lines: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    torn_tail_bytes: int = 0
    set_aside: list[Path] = field(default_factory=list)
    dry_run: bool = False

    @property
    def damaged(self) -> bool:
        """True when anything could not be carried over."""
        return bool(self.bad_lines or self.gaps)


def repair_kb(kb_path: Path, *, output: Path | None = None, dry_run: bool = False,
              lock_timeout: float | None = None) -> RepairReport:
    """Salvages every valid journal transaction into a new KB file.

    Reads the KB file and every journal line that passes its checks (including good entries
    hidden inside a damaged line), applies them in order, and writes the result as a new file:
    `output`, or in place of the KB file, keeping the old file and journal beside it
    (``.before-repair-<time>``) and starting an empty journal. A damaged KB *file* cannot be
    repaired here: restore a backup. A KB holding a line or file a newer kb-mcp wrote is refused
    (KBNewerFormatError) before anything is written: it is not damaged.
    """
    _usable(kb_path)
    journal_path = kb_path.with_name(kb_path.name + ".journal")
    report = RepairReport(kb_path, output or kb_path, dry_run=dry_run)
    mode, gid = mode_of(kb_path)
    lock = KBLock(kb_path, lock_timeout, mode=mode)
    with lock.held(), lock.writing():
        if not kb_path.exists():
            raise KBFileError(f"no KB file at {kb_path}", where=kb_path,
                              action=f"restore a backup (`kb-mcp --kb {kb_path} kb restore`): repair needs the KB "
                              "file")
        try:
            tables = _load_tables(kb_path, kb_path)
        except KBCorruptError as exc:
            raise KBCorruptError(f"{exc.message}: the KB file itself is damaged, which repair cannot mend",
                                 where=kb_path, action=damaged_file_hint(kb_path)) from exc
        found = journal.salvage(journal_path)
        refuse_newer_lines(journal_path, found)  # a newer kb-mcp's line is not damage to leave out
        report.torn_tail_bytes = found.torn_tail
        for line, bad in found.bad:
            report.bad_lines.append(f"line {line} (byte offset {bad.offset}, {bad.length} bytes): {bad.reason}")
        last = int(tables.meta.get("applied_seq", 0))
        for offset, line, entry in found.entries:
            if entry.seq <= last:
                report.skipped_duplicates += 1
                continue
            if entry.seq != last + 1:
                lost = f"transaction {last + 1} is" if entry.seq == last + 2 else ("transactions "
                                                                                   f"{last + 1}..{entry.seq - 1} are")
                report.gaps.append(f"{lost} missing before line {line} (not in the file or any good line)")
            try:
                tables.replay(entry.ops)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
                report.bad_lines.append(
                    f"line {line} (byte offset {offset}): transaction {entry.seq} does not apply "
                    f"({type(exc).__name__}: {exc})"
                )
                continue
            report.transactions += 1
            report.first_seq = entry.seq if report.first_seq is None else report.first_seq
            report.last_seq = last = entry.seq
        if dry_run:
            return report
        tables.meta["applied_seq"] = last + 1
        data = tables.to_tinydb()
        try:
            if output is not None:
                AtomicJSONStorage(output).write(data)
                return report
            stamp = _stamp()
            tmp = AtomicJSONStorage(kb_path).write_temp(data, mode, gid)
            report.set_aside.append(_keep(kb_path, kb_path.with_name(f"{kb_path.name}.before-repair-{stamp}")))
            if journal_path.exists():
                report.set_aside.append(
                    _keep(journal_path, journal_path.with_name(f"{journal_path.name}.before-repair-{stamp}"))
                )
            os.replace(tmp, kb_path)
            journal.fsync_dir(kb_path.parent)
            journal.reset(journal_path, mode, gid)
        except OSError as exc:
            raise storage_error(exc, "write the repaired KB file", output or kb_path) from exc
    return report


def describe_backup(b: backups.Backup) -> str:
    """One line for `kb restore --list`."""
    return f"{b.path.name}  {b.created:%Y-%m-%d %H:%M:%S} UTC  transaction {b.applied_seq}  {b.size / 1e6:.1f} MB"
