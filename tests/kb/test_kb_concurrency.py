"""Several real processes on one KB file: no lost update (8 processes x 250 records), and writers
killed with SIGKILL at any moment (50 kills, five racing writers at a time) never leave a file that
fails to load or lose a committed transaction."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kb_mcp.kb.models import ALL_ARCH
from kb_mcp.kb.store import KBStore
from kb_mcp.policy import update

WORKER = Path(__file__).with_name("kb_worker.py")
sys.path.insert(0, str(WORKER.parent))
import kb_worker  # noqa: E402


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.slow
def test_eight_processes_record_2000_outcomes_none_lost(kb_path: Path) -> None:
    KBStore.open(kb_path)  # create before the race, so every worker opens the same seeded file
    n_proc, per_proc = 8, 250
    procs = [_spawn("record", str(kb_path), f"w{p}", str(per_proc)) for p in range(n_proc)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]

    store = KBStore.open(kb_path)
    stats = store.stats()
    assert stats.outcomes == {"faster": n_proc * per_proc}
    assert stats.candidates == n_proc * per_proc
    logs = [math.log(2.0 / kb_worker.time_ms(f"w{p}", i)) for p in range(n_proc) for i in range(per_proc)]
    for arch in ("hopper", ALL_ARCH):
        score = store.get_score(kb_worker.STATE, kb_worker.OPT, arch)
        assert score is not None
        assert score.attempts == score.samples == n_proc * per_proc, arch
        assert score.successes == sum(1 for x in logs if x > 0)
        # every client's share of the bounded statistics is there (policy.update: per client, then in total)
        assert sorted(score.clients) == [f"w{p}" for p in range(n_proc)]
        assert score.weight == pytest.approx(update.MAX_WEIGHT)
        assert min(logs) <= score.mean_log_speedup <= max(logs)


KILLS = 50  # the bar: 50 SIGKILLs mid-write lose nothing
WRITERS = 5  # killed per round, each at its own moment; they race for the lock meanwhile
RANGE = 1_000_000  # writer w writes candidate ids from w * RANGE on


@pytest.mark.slow
def test_sigkill_mid_write_never_breaks_the_file(kb_path: Path) -> None:
    KBStore.open(kb_path)
    rng = random.Random(1234)
    committed: set[int] = set()
    starts = [w * RANGE for w in range(WRITERS)]
    kills = 0
    while kills < KILLS:
        procs = [_spawn("churn", str(kb_path), str(start)) for start in starts]
        first = []
        for proc in procs:
            assert proc.stdout is not None
            first.append(proc.stdout.readline())  # the writer is up and committing
        for proc in procs:  # then kill each somewhere in a journal append or a rewrite
            time.sleep(rng.random() * 0.15)
            proc.send_signal(signal.SIGKILL)
            kills += 1
        for proc, line in zip(procs, first):
            out, _ = proc.communicate(timeout=30)
            committed.update(int(x) for x in (line + out).split())
        store = KBStore.open(kb_path)  # must load, whatever the kills interrupted
        stats = store.stats()
        with store.read() as view:
            have = {int(c.candidate_id[2:]) for c in view.list_candidates()}
        missing = committed - have
        assert not missing, f"committed transactions lost after {kills} kills: {sorted(missing)[:5]}"
        assert stats.candidates == len(have)
        starts = [max((i for i in have if w * RANGE <= i < (w + 1) * RANGE), default=w * RANGE - 1) + 1
                  for w in range(WRITERS)]
    assert kills >= KILLS and len(committed) > 100, "the writers should have committed many transactions"
    # and writing continues normally after all that
    with KBStore.open(kb_path).transaction() as tx:
        tx.bump_transition(kb_worker.STATE, kb_worker.OPT, "compute_throughput_saturated")
    assert KBStore.open(kb_path).transitions(kb_worker.STATE)[0].count == 1


def test_deleting_a_live_lock_lets_the_stalled_holder_write_nothing(kb_path: Path) -> None:
    """The old advice ("delete the lock file") followed while the holder lives: another writer gets in,
    and when the holder resumes it refuses to write instead of clobbering what was acknowledged."""
    KBStore.open(kb_path)
    stalled = subprocess.Popen([sys.executable, str(WORKER), "stall", str(kb_path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert stalled.stdout is not None and stalled.stdin is not None
    assert stalled.stdout.readline().strip() == "held"
    lock = Path(str(kb_path) + ".lock")
    lock.unlink()  # the holder is alive and mid-transaction
    other = _spawn("record", str(kb_path), "w", "20")  # takes a new lock file at once and commits 20 outcomes
    _, err = other.communicate(timeout=120)
    assert other.returncode == 0, err[-2000:]
    journal_before = Path(str(kb_path) + ".journal").read_bytes()
    out, err = stalled.communicate("go\n", timeout=60)
    assert out.strip() == "refused", err[-2000:]
    assert Path(str(kb_path) + ".journal").read_bytes() == journal_before, "nothing may be cut or appended"
    store = KBStore.open(kb_path)
    assert store.stats().outcomes == {"faster": 20} and store.get_candidate("c_stalled") is None


@pytest.mark.parametrize("step", ["replace", "reset"])
def test_a_writer_let_in_by_a_deleted_lock_during_a_compaction_loses_no_acknowledged_write(
    kb_path: Path, step: str
) -> None:
    """The lock file deleted while its holder compacts (stopped just before it replaces the KB file, or
    just before it empties the journal): a second writer takes a new lock file at once. Whatever each
    of the two acknowledges must be in the KB afterwards, and the KB must load."""
    KBStore.open(kb_path)
    folder = subprocess.Popen([sys.executable, str(WORKER), "fold-stall", str(kb_path), step], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert folder.stdout is not None and folder.stdin is not None
    assert [folder.stdout.readline().strip() for _ in range(2)] == ["in", "paused"]
    Path(str(kb_path) + ".lock").unlink()
    other = _spawn("put", str(kb_path), "c_other")
    assert other.stdout is not None
    assert other.stdout.readline().strip() == "in"  # it holds a lock file of its own
    try:  # it may write now or wait for the compaction to end; give it time to write
        other.wait(timeout=3)
    except subprocess.TimeoutExpired:
        pass
    folder_out, folder_err = folder.communicate("go\n", timeout=60)
    other_out, other_err = other.communicate(timeout=60)
    said = {"c_folder": folder_out.split()[-1:], "c_other": other_out.split()[-1:]}
    assert said["c_folder"] == ["committed"], folder_err[-2000:]
    assert said["c_other"] in (["committed"], ["refused"]), other_err[-2000:]
    with KBStore.open(kb_path).read() as view:
        have = {c.candidate_id for c in view.list_candidates()}
    lost = [c for c, words in said.items() if words == ["committed"] and c not in have]
    assert not lost, f"acknowledged writes lost ({said}): {lost}"


@pytest.mark.slow
def test_deleting_the_lock_file_again_and_again_loses_no_acknowledged_write(kb_path: Path) -> None:
    """Four writers (journal appends and compactions) while the lock file is deleted every few
    milliseconds: writers may refuse, but every transaction they acknowledged is in the KB. The chaos
    lasts at least 6 s and until the writers have acknowledged 60 transactions (a loaded machine writes
    slower), 60 s at most."""
    KBStore.open(kb_path)
    writers = [_spawn("chaos", str(kb_path), f"p{w}") for w in range(4)]
    said: list[list[str]] = [[] for _ in writers]  # each writer's words as they come (its pipe read meanwhile)
    readers = [threading.Thread(target=_read_words, args=(w, said[n]), daemon=True) for n, w in enumerate(writers)]
    for r in readers:
        r.start()
    lock = Path(str(kb_path) + ".lock")
    rng = random.Random(7)
    deletions = 0
    start = time.monotonic()
    while time.monotonic() - start < 60.0 and (time.monotonic() - start < 6.0 or _acknowledged(said) < 60):
        time.sleep(rng.random() * 0.02)
        try:
            lock.unlink()
            deletions += 1
        except FileNotFoundError:
            pass
    elapsed = time.monotonic() - start
    for w in writers:
        w.send_signal(signal.SIGKILL)
    acknowledged: dict[str, set[int]] = {}
    conflicts = 0
    for n, (w, r) in enumerate(zip(writers, readers)):
        w.wait(timeout=60)
        r.join(timeout=60)
        err = w.stderr.read() if w.stderr else ""
        conflicts += said[n].count("conflict")
        acknowledged[f"p{n}"] = {int(x) for x in said[n] if x != "conflict"}
        assert "Traceback" not in err or "KeyboardInterrupt" in err, err[-2000:]
    store = KBStore.open(kb_path)
    with store.read() as view:
        have = {c.candidate_id for c in view.list_candidates()}
    missing = [f"c_{p}_{i}" for p, ids in acknowledged.items() for i in ids if f"c_{p}_{i}" not in have]
    assert not missing, f"acknowledged writes lost: {missing[:5]} ({len(missing)} in all)"
    acked = sum(map(len, acknowledged.values()))
    assert deletions > 50 and acked > 50, (
        f"too little chaos to prove anything in {elapsed:.1f} s (the 60 s ceiling: {elapsed >= 60.0}): "
        f"{deletions} lock file deletions (need > 50), {acked} acknowledged transactions (need > 50), "
        f"{conflicts} refused"
    )


def _read_words(proc: subprocess.Popen[str], into: list[str]) -> None:
    """A writer's stdout, word by word as it prints them, until it ends."""
    assert proc.stdout is not None
    for line in proc.stdout:
        into.extend(line.split())


def _acknowledged(said: list[list[str]]) -> int:
    return sum(1 for words in said for w in list(words) if w != "conflict")
