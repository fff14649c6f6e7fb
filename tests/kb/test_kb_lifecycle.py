"""The KB file's life (kb.lifecycle, KBStore.open): created only where nothing of a KB is, refused
when missing beside its remains, backed up at compaction and restored with one call, repaired by
salvaging every valid journal line, kept read-only when read-only, private (or group-shared) modes."""

from __future__ import annotations

import grp
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kb_mcp.kb import backups, journal, lifecycle, paths
from kb_mcp.kb.errors import KBCorruptError, KBMissingError, KBNewerFormatError, KBReadOnlyError, StorageError
from kb_mcp.kb.files import head_seq
from kb_mcp.kb.models import CandidateRecord, Verdict
from kb_mcp.kb.store import KBStore


def _candidate(cid: str) -> CandidateRecord:
    return CandidateRecord(candidate_id=cid, problem="p", problem_hash="h", verdict=Verdict.faster, arch="sm_90",
                           time_ms=1.0, eager_ms=2.0)


def _write(store: KBStore, *cids: str) -> None:
    for cid in cids:
        with store.transaction() as tx:
            tx.put_candidate(_candidate(cid))


def _ids(kb_path: Path) -> set[str]:
    with KBStore.open(kb_path, create=False).read() as view:
        return {c.candidate_id for c in view.list_candidates()}


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ---- creation and the missing KB --------------------------------------------------------------------


def test_first_use_creates_a_private_kb_where_nothing_of_one_is(kb_path: Path) -> None:
    KBStore.open(kb_path)
    assert _mode(kb_path) == 0o600 and _mode(Path(str(kb_path) + ".journal")) == 0o600


def test_a_deleted_kb_file_is_refused_saying_what_is_left_and_nothing_is_created(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    _write(store, "c_1")
    candidates = paths.artifacts_dir(kb_path) / "candidates"
    candidates.mkdir(parents=True)
    (candidates / "c_1.py").write_text("class ModelNew: pass\n")
    kb_path.unlink()  # an accidental rm
    with pytest.raises(KBMissingError) as err:
        KBStore.open(kb_path)
    text = str(err.value)
    assert str(kb_path) in text and "journal" in text and "candidate and profile files" in text
    assert "kb init" in text and err.value.whose == "environment"
    assert not kb_path.exists(), "no empty KB may be created over the remains of the old one"
    with pytest.raises(KBMissingError, match="disappeared while in use"):
        store.get_candidate("c_1")  # a running server notices too


def test_a_kb_file_cut_to_nothing_is_called_empty_and_restore_brings_it_back(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    _write(store, "c_1")
    store.backup()
    _write(store, "c_2")
    kb_path.write_bytes(b"")  # `> kb.json`, or a file system that lost the file's blocks
    with pytest.raises(KBMissingError) as err:
        KBStore.open(kb_path)
    assert "is empty (0 bytes)" in err.value.message and "deleted or moved" not in err.value.message
    assert err.value.action and "kb restore" in err.value.action
    lifecycle.restore_kb(kb_path)
    assert _ids(kb_path) == {"c_1", "c_2"}


def test_an_explicit_init_creates_beside_remains_and_sets_a_stray_journal_aside(kb_path: Path) -> None:
    _write(KBStore.open(kb_path), "c_old")
    kb_path.unlink()
    report = lifecycle.init_kb(kb_path)
    assert report.created and "set aside" in report.notes[0]
    assert _ids(kb_path) == set()
    aside = [p for p in kb_path.parent.iterdir() if ".journal.orphaned-" in p.name]
    assert len(aside) == 1 and b"c_old" in aside[0].read_bytes()


# ---- backups and restore ------------------------------------------------------------------------------


def test_compaction_keeps_rotated_backups_and_restore_brings_back_a_deleted_kb_whole(kb_path: Path) -> None:
    store = KBStore.open(kb_path, compact_min_bytes=3000, compact_fraction=0.0, backups=3)
    cids = [f"c_{i}" for i in range(60)]
    _write(store, *cids)  # several compactions
    while Path(str(kb_path) + ".journal").stat().st_size == 0:  # and journal entries after the last one
        cids.append(f"c_{len(cids)}")
        _write(store, cids[-1])
    kept = backups.list_backups(kb_path)
    assert len(kept) == 3 and kept[0].applied_seq > kept[1].applied_seq > kept[2].applied_seq
    assert all(_mode(b.path) == 0o600 for b in kept)
    kb_path.unlink()
    with pytest.raises(KBMissingError, match="kb restore"):
        KBStore.open(kb_path)
    report = lifecycle.restore_kb(kb_path)
    assert report.journal_kept and report.backup == kept[0].path
    assert _ids(kb_path) == set(cids), "the newest backup plus the journal is the whole KB"


def test_junk_in_the_backups_folder_is_passed_over_by_listing_rotation_and_restore(kb_path: Path) -> None:
    store = KBStore.open(kb_path, backups=2)
    _write(store, "c_1")
    store.backup()
    folder = paths.backups_dir(kb_path)
    junk = [folder / f"{kb_path.name}.20261399T999999000000Z.seq9.json",  # a backup's shape, no time
            folder / f"{kb_path.name}.20990101T000000000000Z.seq9.json",  # a folder named like a backup
            folder / "notes.txt"]
    junk[0].write_text("junk")
    junk[1].mkdir()
    junk[2].write_text("mine")
    _write(store, "c_2")
    store.backup()
    store.backup()  # rotation drops the oldest backup, never the junk
    kept = backups.list_backups(kb_path)
    assert len(kept) == 2 and all(b.path.is_file() and b.path not in junk for b in kept)
    assert all(j.exists() for j in junk)
    kb_path.unlink()
    done = _cli("--kb", str(kb_path), "kb", "restore")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert _ids(kb_path) == {"c_1", "c_2"}


def test_restoring_an_older_backup_goes_back_in_time_and_keeps_what_it_replaces(kb_path: Path) -> None:
    store = KBStore.open(kb_path, compact_min_bytes=3000, compact_fraction=0.0, backups=5)
    _write(store, *[f"c_{i}" for i in range(60)])
    n = 60
    while Path(str(kb_path) + ".journal").stat().st_size == 0:  # a journal that continues the newest file only
        _write(store, f"c_{n}")
        n += 1
    oldest = backups.list_backups(kb_path)[-1]
    before = kb_path.read_bytes()
    report = lifecycle.restore_kb(kb_path, oldest.path)
    assert not report.journal_kept
    restored = _ids(kb_path)
    assert restored and len(restored) < n
    kept = {p.name.split(".before-restore-")[0]: p for p in report.set_aside}
    assert kept["kb.json"].read_bytes() == before and "kb.json.journal" in kept


# ---- repair -------------------------------------------------------------------------------------------


def test_repair_salvages_every_valid_transaction_of_a_journal_with_a_flipped_byte(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    _write(store, *[f"c_{i}" for i in range(10)])
    j = Path(str(kb_path) + ".journal")
    lines = j.read_bytes().splitlines(keepends=True)
    damaged = bytearray(j.read_bytes())
    damaged[sum(map(len, lines[:2])) + 40] ^= 0x04  # line 3
    j.write_bytes(bytes(damaged))
    with pytest.raises(KBCorruptError):
        KBStore.open(kb_path)

    dry = lifecycle.repair_kb(kb_path, dry_run=True)
    assert dry.transactions == 9 and j.read_bytes() == bytes(damaged)
    report = lifecycle.repair_kb(kb_path)
    assert report.transactions == 9 and len(report.bad_lines) == 1 and "line 3" in report.bad_lines[0]
    assert report.gaps == ["transaction 3 is missing before line 4 (not in the file or any good line)"]
    assert _ids(kb_path) == {f"c_{i}" for i in range(10)} - {"c_2"}
    kept_journal = next(p for p in report.set_aside if ".journal.before-repair-" in p.name)
    assert kept_journal.read_bytes() == bytes(damaged)
    with KBStore.open(kb_path).transaction() as tx:  # and the KB takes writes again
        tx.put_candidate(_candidate("c_new"))
    assert "c_new" in _ids(kb_path)


def test_repair_finds_an_entry_hidden_in_a_line_whose_newline_was_lost(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    _write(store, "c_a", "c_b", "c_c")
    j = Path(str(kb_path) + ".journal")
    lines = j.read_bytes().splitlines(keepends=True)
    j.write_bytes(lines[0] + lines[1][:30] + lines[2])  # line 2 torn mid-way, line 3 appended after it
    report = lifecycle.repair_kb(kb_path, output=kb_path.with_name("repaired.json"))
    assert report.transactions == 2 and len(report.bad_lines) == 1
    assert _ids(kb_path.with_name("repaired.json")) == {"c_a", "c_c"}


# ---- read-only and modes ------------------------------------------------------------------------------


def test_a_read_only_kb_is_never_written_and_still_answers_reads(kb_path: Path) -> None:
    store = KBStore.open(kb_path, compact_min_bytes=0, compact_fraction=0.0)
    _write(store, "c_1")
    os.chmod(kb_path, 0o444)
    before = (kb_path.read_bytes(), Path(str(kb_path) + ".journal").read_bytes(), os.stat(kb_path).st_ino)
    for s in (store, KBStore.open(kb_path)):
        with pytest.raises(KBReadOnlyError) as err:
            with s.transaction() as tx:
                tx.put_candidate(_candidate("c_2"))
        assert "read-only" in str(err.value) and "0444" in str(err.value) and "chmod u+w" in str(err.value)
        with pytest.raises(KBReadOnlyError):
            s.compact()
        assert s.get_candidate("c_1") is not None
    after = (kb_path.read_bytes(), Path(str(kb_path) + ".journal").read_bytes(), os.stat(kb_path).st_ino)
    assert after == before and _mode(kb_path) == 0o444


def test_compaction_keeps_the_kb_files_mode(kb_path: Path) -> None:
    store = KBStore.open(kb_path, compact_min_bytes=0, compact_fraction=0.0)
    os.chmod(kb_path, 0o640)
    _write(store, "c_1", "c_2")  # each commit rewrites the file
    assert _mode(kb_path) == 0o640 and _mode(Path(str(kb_path) + ".journal")) == 0o640


def test_init_with_a_group_shares_the_kb_and_its_folders(kb_path: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    report = lifecycle.init_kb(kb_path, group=group)
    assert report.created
    for path in (kb_path, Path(str(kb_path) + ".journal")):
        assert _mode(path) == 0o660 and os.stat(path).st_gid == os.getgid()
    for folder in (paths.artifacts_dir(kb_path), paths.backups_dir(kb_path)):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o2770
    assert paths.umask_for(_mode(kb_path)) == 0o007
    _write(KBStore.open(kb_path, compact_min_bytes=0, compact_fraction=0.0), "c_1")
    assert _mode(kb_path) == 0o660  # a compaction keeps it shared


def test_an_existing_kb_can_be_shared_later(kb_path: Path) -> None:
    KBStore.open(kb_path)
    assert _mode(kb_path) == 0o600
    lifecycle.init_kb(kb_path, group=grp.getgrgid(os.getgid()).gr_name)
    assert _mode(kb_path) == 0o660


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A real 4 MB file system (a tmpfs), so that a full disk is a full disk."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"needs permission to mount a small tmpfs for a real full disk: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(disk: Path) -> None:
    """Writes a filler file on `disk` until the disk is full."""
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_full_disk_is_the_environments_fault_and_loses_nothing_acknowledged(tiny_disk: Path) -> None:
    kb = tiny_disk / "kb.json"
    store = KBStore.open(kb)
    _fill(tiny_disk)
    acknowledged = []
    with pytest.raises(StorageError) as err:
        for i in range(1000):
            with store.transaction() as tx:
                tx.put_candidate(_candidate(f"c_{i}"))
            acknowledged.append(f"c_{i}")
    assert err.value.whose == "environment" and "No space left" in str(err.value)
    assert err.value.action and "free disk space" in err.value.action and err.value.where
    (tiny_disk / "filler").unlink()
    assert _ids(kb) == set(acknowledged)  # the journal has no half line, nothing committed is missing
    _write(KBStore.open(kb), "c_after")
    assert "c_after" in _ids(kb)


def test_a_compaction_whose_backup_cannot_be_kept_keeps_the_journal_so_restore_loses_nothing(
    tiny_disk: Path, kb_path: Path
) -> None:
    paths.backups_dir(kb_path).symlink_to(tiny_disk)  # the backups alone on a disk about to be full
    store = KBStore.open(kb_path, compact_min_bytes=3000, compact_fraction=0.0)
    _write(store, "c_0")
    store.backup()
    _fill(tiny_disk)
    base = head_seq(kb_path)
    cids = ["c_0"]
    while head_seq(kb_path) == base:  # until a compaction folded the journal into the file
        cids.append(f"c_{len(cids)}")
        _write(store, cids[-1])
    _write(store, "c_last")
    assert len(backups.list_backups(kb_path)) == 1, "no backup fits on the full disk"
    kb_path.unlink()
    report = lifecycle.restore_kb(kb_path)
    assert report.journal_kept, "the newest backup plus the journal is the whole KB"
    assert _ids(kb_path) == {*cids, "c_last"}


_FSIZE_WRITER = """
import resource, sys
from kb_mcp.kb.models import CandidateRecord, Verdict
from kb_mcp.kb.store import KBStore
store = KBStore.open(sys.argv[1], compact_min_bytes=int(sys.argv[2]), compact_fraction=0.0)
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # no file of this process grows past it
for i in range(10_000):
    try:
        with store.transaction() as tx:
            tx.put_candidate(CandidateRecord(candidate_id=f"c_{i}", problem="p", problem_hash="h", verdict="slower"))
    except Exception as exc:
        print("refused", type(exc).__name__, getattr(exc, "whose", ""), exc, flush=True)
        break
    print(f"c_{i}", flush=True)
"""


@pytest.mark.parametrize("compact_min_bytes", [10**9, 3000], ids=["journal append", "compaction"])
def test_a_write_cut_by_the_file_size_limit_is_the_environments_and_loses_nothing_acknowledged(
    kb_path: Path, compact_min_bytes: int
) -> None:
    _write(KBStore.open(kb_path), "c_seed")
    limit = kb_path.stat().st_size + 4000  # a few journal lines more, and never a whole new KB file
    done = subprocess.run([sys.executable, "-c", _FSIZE_WRITER, str(kb_path), str(compact_min_bytes), str(limit)],
                          capture_output=True, text=True, timeout=120)
    said = done.stdout.splitlines()
    assert said and said[-1].startswith("refused StorageError environment"), done.stdout + done.stderr
    assert "File too large" in said[-1] and "ulimit -f" in said[-1]
    if compact_min_bytes < limit:  # compactions failed first; the transactions they followed stood
        assert "is committed in the journal, but the KB was not compacted" in done.stderr
    assert _ids(kb_path) == {"c_seed", *said[:-1]}  # every acknowledged write, and no half line
    _write(KBStore.open(kb_path), "c_after")
    assert "c_after" in _ids(kb_path)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_one_command_restores_a_deleted_kb_and_one_repairs_a_damaged_journal(kb_path: Path) -> None:
    kb = str(kb_path)
    _write(KBStore.open(kb_path), "c_1", "c_2")
    assert _cli("--kb", kb, "kb", "backup").returncode == 0
    _write(KBStore.open(kb_path), "c_3")
    kb_path.unlink()
    listed = _cli("--kb", kb, "kb", "restore", "--list")
    assert listed.returncode == 0 and "seq" in listed.stdout
    done = _cli("--kb", kb, "kb", "restore")
    assert done.returncode == 0 and "nothing was lost" in done.stdout, done.stderr
    assert _ids(kb_path) == {"c_1", "c_2", "c_3"}

    j = Path(kb + ".journal")
    data = bytearray(j.read_bytes())
    data[20] ^= 0x10
    j.write_bytes(bytes(data))
    stats = _cli("--kb", kb, "kb", "stats")
    assert stats.returncode == 3 and "line 1" in stats.stderr and "kb repair" in stats.stderr
    fixed = _cli("--kb", kb, "kb", "repair")
    assert fixed.returncode == 0 and "left out damaged line 1" in fixed.stdout, fixed.stderr
    assert _cli("--kb", kb, "kb", "stats").returncode == 0 and _ids(kb_path) == {"c_1", "c_2"}


def test_a_kb_file_edited_to_hold_a_nan_is_damaged_and_its_backup_brings_it_back(kb_path: Path) -> None:
    kb = str(kb_path)
    _write(KBStore.open(kb_path), "c_1")
    assert _cli("--kb", kb, "kb", "backup").returncode == 0
    text = kb_path.read_text()
    edited = re.sub(r'"fuse_elementwise_chain":\[[-0-9.e]+,', '"fuse_elementwise_chain":[NaN,', text, count=1)
    assert edited != text
    kb_path.write_text(edited)  # by hand, or by anyone the file lets write
    for argv in (["kb", "stats"], ["call", "suggest_optimizations", "--arg", "state_id=memory_bandwidth_saturated"]):
        said = _cli("--kb", kb, *argv)
        assert said.returncode == 3, said.stdout + said.stderr
        assert "NaN is not a JSON number" in said.stderr and "kb restore" in said.stderr, said.stderr
        assert "Traceback" not in said.stderr
    assert _cli("--kb", kb, "kb", "restore").returncode == 0
    assert _cli("--kb", kb, "kb", "stats").returncode == 0 and _ids(kb_path) == {"c_1"}


def test_a_damaged_kb_file_without_backup_leads_every_command_to_a_new_kb(kb_path: Path) -> None:
    kb = str(kb_path)
    _write(KBStore.open(kb_path), "c_1")
    kb_path.write_text("not json{")
    said = {}
    for argv in (["kb", "stats"], ["kb", "repair"], ["kb", "restore"], ["doctor"]):
        done = _cli("--kb", kb, *argv)
        assert done.returncode == 3, done.stdout + done.stderr  # the machine's to fix (doctor: a check failed)
        said[argv[-1]] = " ".join((done.stderr + done.stdout).split())  # doctor wraps its table's lines
    for text in said.values():
        # the one way out: the damaged file set aside, a new KB at the same path
        assert f"move it aside (`mv {kb} {kb}.damaged`) and start a new KB with `kb-mcp --kb {kb} kb init`" in text
        commands = re.findall(r"`(kb-mcp [^`]*)`", text)
        assert commands and all(c.startswith(f"kb-mcp --kb {kb} ") for c in commands), text
    assert "salvages what it can" not in said["stats"] and "Restore a backup" not in said["repair"]
    os.replace(kb_path, kb + ".damaged")  # as the message says
    assert _cli("--kb", kb, "kb", "init").returncode == 0
    assert _cli("--kb", kb, "kb", "stats").returncode == 0


def test_artifacts_written_after_the_kb_is_opened_are_private_like_the_kb(kb_path: Path) -> None:
    from kb_mcp.tools.context import ToolContext

    before = os.umask(0o022)
    try:
        ctx = ToolContext(kb_path)
        ctx.candidates_dir.mkdir(parents=True)  # opens (creates) the KB first, then follows its mode
        (ctx.candidates_dir / "c_1.py").write_text("class ModelNew: pass\n")
        assert _mode(kb_path) == 0o600
        assert _mode(ctx.candidates_dir) == 0o700 and _mode(ctx.candidates_dir / "c_1.py") == 0o600
    finally:
        os.umask(before)


@pytest.mark.parametrize("argv", [["kb", "init"], ["kb", "stats"], ["kb", "states"], ["kb", "backup"],
                                  ["kb", "restore"], ["kb", "repair"], ["kb", "export", "out.json"]])
def test_a_kb_path_below_a_file_is_refused_naming_the_file_by_every_command(tmp_path: Path, argv: list[str]) -> None:
    # KB_MCP_HOME set to a file (or --kb .../kb.json/kb.json): no KB can be there, and nothing is written
    home = tmp_path / "home"
    home.write_text("not a folder\n")
    done = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", *argv], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, paths.ENV_HOME: str(home), paths.ENV_KB: ""})
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert f"{home} is a file, not a folder" in done.stderr and "KB_MCP_HOME" in done.stderr
    assert home.read_text() == "not a folder\n" and sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_listing_a_deleted_kb_beside_its_backup_says_restore_it_not_init(kb_path: Path) -> None:
    kb = str(kb_path)
    _write(KBStore.open(kb_path), "c_1")
    assert _cli("--kb", kb, "kb", "backup").returncode == 0
    kb_path.unlink()
    for action in ("states", "candidates", "outcomes", "campaigns"):
        done = _cli("--kb", kb, "kb", action)
        assert done.returncode == 3 and "kb restore" in done.stderr, done.stderr
        assert "kb init" not in done.stderr and not kb_path.exists()


# ---- what a newer kb-mcp wrote --------------------------------------------------------------------


def _append_newer_line(kb_path: Path, ops: list[list[object]]) -> bytes:
    """Appends a line as a newer kb-mcp would: checksummed by the journal's own writer, in sequence."""
    j = Path(str(kb_path) + ".journal")
    data = j.read_bytes()
    last = journal.decode(data.splitlines()[-1]).seq
    j.write_bytes(data + journal.encode(journal.Entry(last + 1, ops, len(data))))
    return j.read_bytes()


def _refusals(kb: str, *argvs: list[str]) -> dict[str, str]:
    said = {}
    for argv in argvs:
        done = _cli("--kb", kb, *argv)
        text = " ".join((done.stderr + done.stdout).split())  # doctor wraps its table's lines
        assert done.returncode == 3, text  # the machine's to fix (doctor: a check failed)
        assert "Traceback" not in text
        said[" ".join(argv)] = text
    return said


EVERY_READER = (["kb", "stats"], ["kb", "repair"], ["kb", "restore"], ["doctor"])


def test_a_line_of_a_newer_kb_mcp_is_refused_by_every_command_with_upgrade_words_and_kept_byte_for_byte(
    kb_path: Path,
) -> None:
    kb = str(kb_path)
    _write(KBStore.open(kb_path), "c_1", "c_2")
    assert _cli("--kb", kb, "kb", "backup").returncode == 0
    _write(KBStore.open(kb_path), "c_3")
    j = Path(kb + ".journal")
    written = _append_newer_line(kb_path, [["frobnicate", "candidates", "c_1"]])
    file_before = kb_path.read_bytes()
    before = set(os.listdir(kb_path.parent))

    with pytest.raises(KBNewerFormatError) as err:
        KBStore.open(kb_path)
    assert err.value.line == 2 and err.value.where == str(j) and "frobnicate" in err.value.found

    for text in _refusals(kb, *EVERY_READER).values():
        assert "frobnicate" in text and str(j) in text and "line 2" in text, text
        assert "upgrade kb-mcp on this machine to the version that wrote it" in text.lower(), text
        assert "is damaged" not in text, text
    assert j.read_bytes() == written and kb_path.read_bytes() == file_before  # nothing repaired away
    assert set(os.listdir(kb_path.parent)) == before  # no copy kept as damaged, nothing set aside

    # the same line with one flipped byte is damage, as before: refused with the way to repair it
    data = bytearray(written)
    data[len(data) - 10] ^= 0x01
    j.write_bytes(bytes(data))
    stats = _cli("--kb", kb, "kb", "stats")
    assert stats.returncode == 3 and "is damaged" in stats.stderr and "kb repair" in stats.stderr, stats.stderr
    fixed = _cli("--kb", kb, "kb", "repair")
    assert fixed.returncode == 0 and "left out damaged line 2" in fixed.stdout, fixed.stdout + fixed.stderr
    assert _ids(kb_path) == {"c_1", "c_2", "c_3"}


def test_a_kb_file_of_a_newer_schema_version_is_refused_by_every_command_and_left_as_it_is(kb_path: Path) -> None:
    kb = str(kb_path)
    _write(KBStore.open(kb_path), "c_1")
    assert _cli("--kb", kb, "kb", "backup").returncode == 0
    text = kb_path.read_text()
    newer = text.replace('"schema_version":1', '"schema_version":2', 1)
    assert newer != text
    kb_path.write_text(newer)
    before = set(os.listdir(kb_path.parent))
    for said in _refusals(kb, *EVERY_READER).values():
        assert "KB schema version 2" in said and kb in said, said
        assert "upgrade kb-mcp on this machine to the version that wrote it" in said.lower(), said
    assert kb_path.read_text() == newer and set(os.listdir(kb_path.parent)) == before


def test_a_kb_file_with_a_table_this_version_does_not_know_is_refused_not_compacted_without_it(kb_path: Path) -> None:
    _write(KBStore.open(kb_path), "c_1")
    data = json.loads(kb_path.read_text())
    data["experiments"] = {"1": {"id": "e1"}}
    kb_path.write_text(json.dumps(data))
    with pytest.raises(KBNewerFormatError, match="experiments"):
        KBStore.open(kb_path)
    with pytest.raises(KBNewerFormatError):
        lifecycle.repair_kb(kb_path)
    assert json.loads(kb_path.read_text())["experiments"] == {"1": {"id": "e1"}}
