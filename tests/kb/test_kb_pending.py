"""Records persisted before the KB lock (kb.pending, KBStore.commit_soon): a hung lock holder in
another process cannot lose them, and whichever transaction comes next commits them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from kb_mcp.kb import pending
from kb_mcp.kb.errors import KBLockTimeout, KBNewerFormatError
from kb_mcp.kb.models import CandidateRecord, Score, Verdict
from kb_mcp.kb.store import KBStore

WORKER = Path(__file__).with_name("kb_worker.py")


def _record(cid: str) -> CandidateRecord:
    return CandidateRecord(candidate_id=cid, problem="p", problem_hash="h", verdict=Verdict.faster, arch="sm_90",
                           time_ms=1.0, eager_ms=2.0)


def _hung_holder(kb_path: Path) -> subprocess.Popen[str]:
    """A real process that takes the KB lock and never lets go (until killed)."""
    proc = subprocess.Popen([sys.executable, str(WORKER), "hold", str(kb_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held", proc.stderr.read() if proc.stderr else ""
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)


def _wait_for(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_commit_soon_commits_at_once_when_the_lock_is_free(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    assert store.commit_soon("candidate-c_1", lambda tx: tx.put_candidate(_record("c_1")), wait_s=5)
    assert KBStore.open(kb_path).get_candidate("c_1") is not None
    assert store.pending_count() == 0


def test_a_hung_holder_does_not_lose_a_record_the_thread_commits_it_when_the_lock_frees(kb_path: Path) -> None:
    store = KBStore.open(kb_path, lock_timeout=1.0)
    holder = _hung_holder(kb_path)
    try:
        t0 = time.monotonic()
        assert not store.commit_soon("candidate-c_w", lambda tx: tx.put_candidate(_record("c_w")), wait_s=0.5)
        assert time.monotonic() - t0 < 5, "the caller waits only wait_s, not the full lock timeout"
        assert store.pending_count() == 1
        assert store.get_candidate("c_w") is None  # not committed yet: the holder still has the lock
    finally:
        _kill(holder)  # the OS releases a killed holder's lock
    assert _wait_for(lambda: KBStore.open(kb_path).get_candidate("c_w") is not None), "the pending record was lost"
    assert _wait_for(lambda: store.pending_count() == 0)


def test_a_pending_record_outlives_its_process_and_the_next_transaction_anywhere_commits_it(kb_path: Path) -> None:
    KBStore.open(kb_path)
    holder = _hung_holder(kb_path)
    script = (
        "import sys; from kb_mcp.kb.store import KBStore; from kb_mcp.kb.models import CandidateRecord, Score, "
        "Verdict\n"
        "s = KBStore.open(sys.argv[1], lock_timeout=0.5)\n"
        "r = CandidateRecord(candidate_id='c_orphan', problem='p', problem_hash='h', verdict=Verdict.slower)\n"
        "print(s.commit_soon('candidate-c_orphan', lambda tx: tx.put_candidate(r), wait_s=0.3), flush=True)\n"
        "import os; os._exit(0)  # exits before its commit thread could run\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", script, str(kb_path)], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "False", out.stderr
    finally:
        _kill(holder)
    other = KBStore.open(kb_path)
    assert other.get_candidate("c_orphan") is None  # persisted, but only a transaction commits it
    with other.transaction() as tx:
        assert tx.get_candidate("c_orphan") is not None  # folded in before the block runs
        tx.put_candidate(_record("c_mine"))
    fresh = KBStore.open(kb_path)
    assert fresh.get_candidate("c_orphan") is not None and fresh.get_candidate("c_mine") is not None
    assert fresh.pending_count() == 0


def test_a_failed_transaction_keeps_the_pending_records(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    pending.write(
        store.pending_dir,
        "candidate-c_p",
        [["put", "candidates", "c_p", _record("c_p").model_dump(mode="json")]],
        0o600,
    )
    with pytest.raises(RuntimeError):
        with store.transaction():
            raise RuntimeError("boom")
    assert store.pending_count() == 1 and store.get_candidate("c_p") is None
    with store.transaction():
        pass
    assert store.pending_count() == 0 and KBStore.open(kb_path).get_candidate("c_p") is not None


def test_only_whole_record_puts_may_wait_and_a_damaged_file_is_set_aside(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    with pytest.raises(ValueError, match="whole-record puts"):
        store.commit_soon("score", lambda tx: tx.put_score(Score(state_id="s", optimization_id="o")), wait_s=1)
    store.pending_dir.mkdir(parents=True, exist_ok=True)
    (store.pending_dir / "candidate-c_bad.json").write_text('{"key": "x", "crc": 1, "ops": []}')
    with store.transaction():
        pass
    assert (store.pending_dir / "damaged" / "candidate-c_bad.json").exists()


@pytest.mark.parametrize("ops", [
    [["put", 7, "k", {}]],  # a table that is no name: no kb-mcp writes that
    [["put", "candidates", "c_bad", {"verdict": "faster"}]],  # a record without its id
    [["put", "states", "s", None]],  # no record at all
])
def test_a_pending_file_whose_records_do_not_apply_is_set_aside_not_failing_every_transaction(
    kb_path: Path, ops: list[list[object]]
) -> None:
    store = KBStore.open(kb_path)
    pending.write(store.pending_dir, "candidate-c_bad", ops, 0o600)  # framed and checksummed like a good one
    pending.write(store.pending_dir, "candidate-c_p", [["put", "candidates", "c_p", _record("c_p").model_dump(
        mode="json")]], 0o600)
    with store.transaction() as tx:
        tx.put_candidate(_record("c_1"))
    assert (store.pending_dir / "damaged" / "candidate-c_bad.json").exists() and store.pending_count() == 0
    fresh = KBStore.open(kb_path)
    assert fresh.get_candidate("c_1") is not None and fresh.get_candidate("c_p") is not None


def test_lock_timeout_names_the_holder_and_never_advises_deleting_the_lock(kb_path: Path) -> None:
    store = KBStore.open(kb_path, lock_timeout=0.5)
    holder = _hung_holder(kb_path)
    try:
        with pytest.raises(KBLockTimeout) as err:
            with store.transaction():
                pass
    finally:
        _kill(holder)
    text = str(err.value)
    assert f"pid {holder.pid}" in text and os.uname().nodename in text and "since" in text and "ago" in text
    assert f"kill {holder.pid}" in text
    assert "can be deleted" not in text and "Do not delete the lock file" in text
    assert err.value.whose == "environment" and err.value.where == str(store.lock_path)


def test_a_pending_file_of_a_newer_kb_mcp_refuses_the_transaction_and_is_never_set_aside(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    path = pending.write(store.pending_dir, "candidate-c_p", [["put", "candidates", "c_p", {}]], 0o600)
    ops = [["frobnicate", "candidates", "c_p"]]  # checksummed like the writer's own
    body = json.dumps(ops, separators=(",", ":"))
    path.write_text(json.dumps({"key": "candidate-c_p", "crc": zlib.crc32(body.encode()), "ops": ops},
                               separators=(",", ":")))
    written = path.read_bytes()
    with pytest.raises(KBNewerFormatError) as err:
        with store.transaction() as tx:
            tx.put_candidate(_record("c_1"))
    assert err.value.where == str(path) and "frobnicate" in str(err.value)
    assert "upgrade kb-mcp on this machine" in str(err.value).lower()
    assert path.read_bytes() == written and not (store.pending_dir / "damaged").exists()
    assert KBStore.open(kb_path).get_candidate("c_1") is None
