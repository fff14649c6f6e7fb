"""Verdicts stored at once by many threads of several processes (a server's concurrent calls, a
cluster's coordinator storing what its workers send back): every atomic write takes a temp file of
its own, so no writer renames away another's half-written file, nothing raises and nothing is lost."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kb_mcp.kb import pending
from kb_mcp.kb.atomic import temp_beside, write_atomic
from kb_mcp.kb.models import CandidateRecord, Verdict
from kb_mcp.kb.store import KBStore

WORKER = Path(__file__).with_name("kb_worker.py")
THREADS = 12


def _record(cid: str) -> CandidateRecord:
    return CandidateRecord(candidate_id=cid, problem="p", problem_hash="h", verdict=Verdict.slower)


def _all_at_once(work: list[object]) -> list[BaseException]:
    """Runs each callable in a thread of its own, all released together; the exceptions raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(work))

    def run(fn: object) -> None:
        start.wait()
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - every failure is the test's finding
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def test_threads_committing_the_same_keys_lose_nothing_and_raise_nothing(kb_path: Path) -> None:
    store = KBStore.open(kb_path)

    def commit_all() -> None:
        for i in range(15):  # every thread the same keys: the same pending file names
            store.commit_soon(f"candidate-c_{i}", lambda tx, i=i: tx.put_candidate(_record(f"c_{i}")), wait_s=30)

    assert _all_at_once([commit_all] * THREADS) == []
    fresh = KBStore.open(kb_path)
    assert all(fresh.get_candidate(f"c_{i}") is not None for i in range(15))
    assert store.pending_count() == 0
    assert not [p for p in store.pending_dir.iterdir() if ".tmp" in p.name]  # no temp file left behind


def test_pending_writes_of_one_key_from_many_threads_leave_one_whole_record(tmp_path: Path) -> None:
    folder = tmp_path / "pending"
    ops = [["put", "candidates", f"c_{i}", {"candidate_id": f"c_{i}", "pad": "x" * 20_000}] for i in range(THREADS)]

    errors = _all_at_once([lambda op=op: [pending.write(folder, "k", [op], 0o600) for _ in range(20)] for op in ops])
    assert errors == []
    [(path, found)] = pending.read_all(folder)  # one file, whole (its checksum holds), one writer's ops
    assert path.name == "k.json" and found in [[op] for op in ops]
    assert sorted(p.name for p in folder.iterdir()) == ["k.json"]


def test_processes_of_many_threads_storing_verdicts_lose_nothing(tmp_path: Path) -> None:
    """compile_and_verify.record (the candidate's report file, the pending record, the commit) from
    3 processes of 6 threads, each thread storing the same 8 verdicts as its process's others."""
    kb = tmp_path / "kb.json"
    KBStore.open(kb)
    env = {**os.environ, "KB_MCP_HOME": str(tmp_path / "home")}
    procs = [subprocess.Popen([sys.executable, str(WORKER), "verdicts", str(kb), f"p{k}", "8", "6"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(3)]
    outs = [p.communicate(timeout=240) for p in procs]
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0 and out.strip() == "stored", err[-3000:]
    store = KBStore.open(kb)
    for k in range(3):
        for i in range(8):
            stored = store.get_candidate(f"c_p{k}_{i}")
            assert stored is not None and stored.verdict == Verdict.slower, (k, i)
    assert store.pending_count() == 0
    leftovers = [p for p in kb.parent.rglob("*") if ".tmp" in p.name]
    assert leftovers == [], leftovers


def test_write_atomic_replaces_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "table.json"
    bodies = [str(i) * 50_000 for i in range(THREADS)]
    assert _all_at_once([lambda b=b: [write_atomic(target, b) for _ in range(10)] for b in bodies]) == []
    assert target.read_text() in bodies
    assert [p.name for p in tmp_path.iterdir()] == ["table.json"]
    names = {temp_beside(target).name for _ in range(100)}
    assert len(names) == 100 and all(n.startswith(".table.json.tmp-") for n in names)


@pytest.mark.parametrize("data", ["text", b"bytes"])
def test_write_atomic_takes_text_and_bytes(tmp_path: Path, data: str | bytes) -> None:
    write_atomic(tmp_path / "f", data, fsync=True)
    assert (tmp_path / "f").read_bytes() == (data.encode() if isinstance(data, str) else data)
