"""KBStore: creation and seeding, refusal of foreign/corrupt files, transactions, the journal and
compaction, and freshness across store instances (each stands in for another server process)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from tinydb import TinyDB

from kb_mcp.kb.errors import KBCorruptError
from kb_mcp.kb.models import ALL_ARCH, SCHEMA_VERSION, CandidateRecord, Score, Verdict
from kb_mcp.kb.store import KBFileError, KBStore


def _candidate(cid: str, time_ms: float = 1.0) -> CandidateRecord:
    return CandidateRecord(
        candidate_id=cid, problem="p", problem_hash="h", verdict=Verdict.faster, arch="sm_90", time_ms=time_ms,
        eager_ms=2.0
    )


def test_open_creates_seeded_file_readable_by_tinydb(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    assert kb_path.is_file()
    stats = store.stats()
    assert stats.schema_version == SCHEMA_VERSION
    assert stats.states["seed"] >= 23
    assert stats.scores > 0 and stats.measured_scores == 0
    # the file of record is a plain TinyDB database
    db = TinyDB(kb_path, access_mode="r")
    ids = {doc["id"] for doc in db.table("states").all()}
    assert "memory_bandwidth_saturated" in ids
    meta = db.table("meta").all()[0]
    assert meta["format"] == "kb-mcp" and meta["schema_version"] == SCHEMA_VERSION
    db.close()


def test_open_default_path_uses_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KB_MCP_HOME", str(tmp_path / "home"))
    store = KBStore.open()
    assert store.path == (tmp_path / "home" / "kb.json").resolve()
    assert store.path.exists()


@pytest.mark.parametrize(
    "content, words",
    [
        ("{not json", "not valid JSON"),
        ('{"_default": {"1": {"name": "x"}}}', "not a kb-mcp KB"),
        ('[1, 2, 3]', "not a kb-mcp KB"),
        ('{"meta": {"1": {"format": "other-app"}}}', "not a kb-mcp KB"),
    ],
)
def test_corrupt_or_foreign_file_is_refused_and_untouched(kb_path: Path, content: str, words: str) -> None:
    kb_path.write_text(content)
    before = kb_path.stat().st_mtime_ns
    with pytest.raises(KBFileError) as err:
        KBStore.open(kb_path)
    assert str(kb_path) in str(err.value) and words in str(err.value)
    assert kb_path.read_text() == content and kb_path.stat().st_mtime_ns == before


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_kb_file_holding_a_nan_or_an_infinity_is_refused_as_damaged(kb_path: Path, constant: str) -> None:
    KBStore.open(kb_path)
    text = kb_path.read_text()
    edited = re.sub(r'"fuse_elementwise_chain":\[[-0-9.e]+,', f'"fuse_elementwise_chain":[{constant},', text, count=1)
    assert edited != text
    kb_path.write_text(edited)  # what python's json would read, and spread into every expected speedup
    said = f"not valid JSON ({constant} is not a JSON number (at scores/1/priors/fuse_elementwise_chain/0))"
    with pytest.raises(KBCorruptError, match=re.escape(said)):
        KBStore.open(kb_path)
    assert kb_path.read_text() == edited


def test_a_nan_is_never_written_into_a_kb_file(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    before = kb_path.read_bytes(), Path(f"{kb_path}.journal").read_bytes()
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"), \
            store.transaction() as tx:
        tx.put_candidate(CandidateRecord.model_construct(  # built past its validation, as a bug would
            candidate_id="c_nan", problem="p", problem_hash="h", verdict=Verdict.faster, time_ms=float("nan")))
    assert (kb_path.read_bytes(), Path(f"{kb_path}.journal").read_bytes()) == before


def test_newer_schema_is_refused(kb_path: Path) -> None:
    KBStore.open(kb_path)
    data = json.loads(kb_path.read_text())
    data["meta"]["1"]["schema_version"] = SCHEMA_VERSION + 1
    kb_path.write_text(json.dumps(data))
    with pytest.raises(KBFileError, match="newer kb-mcp"):
        KBStore.open(kb_path)


def test_directory_and_missing_without_seed(tmp_path: Path) -> None:
    with pytest.raises(KBFileError, match="directory"):
        KBStore.open(tmp_path)
    with pytest.raises(KBFileError, match="no KB file"):
        KBStore.open(tmp_path / "absent.json", create=False)


def test_writes_of_one_store_are_seen_by_another(kb_path: Path) -> None:
    a = KBStore.open(kb_path)
    b = KBStore.open(kb_path)
    assert b.get_candidate("c_1") is None
    with a.transaction() as tx:
        tx.put_candidate(_candidate("c_1"))
    got = b.get_candidate("c_1")
    assert got is not None and got.time_ms == 1.0
    # and the other way round, inside a transaction (re-read under the lock)
    with b.transaction() as tx:
        assert tx.get_candidate("c_1") is not None
        tx.put_candidate(_candidate("c_2", 3.0))
    assert a.get_candidate("c_2") is not None


def test_failed_transaction_writes_nothing(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    with pytest.raises(RuntimeError):
        with store.transaction() as tx:
            tx.put_candidate(_candidate("c_x"))
            assert tx.get_candidate("c_x") is not None  # visible inside
            raise RuntimeError("boom")
    assert store.get_candidate("c_x") is None
    assert KBStore.open(kb_path).get_candidate("c_x") is None


def test_nested_transaction_joins_outer(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    with store.transaction() as outer:
        with store.transaction() as inner:
            assert inner is outer
            inner.put_candidate(_candidate("c_n"))
    assert store.get_candidate("c_n") is not None


def test_score_round_trip_and_compaction(kb_path: Path) -> None:
    store = KBStore.open(kb_path, compact_min_bytes=2000, compact_fraction=0.0)
    other = KBStore.open(kb_path)
    def applied_seq() -> int:
        return json.loads(kb_path.read_text())["meta"]["1"]["applied_seq"]

    assert applied_seq() == 0
    for i in range(40):
        with store.transaction() as tx:
            tx.put_score(
                Score(
                    state_id="memory_bandwidth_saturated", optimization_id="fuse_elementwise_chain", arch="hopper",
                    mean_log_speedup=0.1 * i, m2_log_speedup=0.5, samples=i + 1, attempts=i + 2, successes=i,
                    compile_failures=1, verify_failures=0, prior=False, prior_mean_log_speedup=0.2, prior_weight=1.0,
                )
            )
            tx.put_candidate(_candidate(f"c_{i}"))
    assert applied_seq() > 1, "a 2 KB threshold must have forced compactions"
    for s in (store, other, KBStore.open(kb_path)):
        score = s.get_score("memory_bandwidth_saturated", "fuse_elementwise_chain", "hopper")
        assert score is not None and not score.prior
        assert (score.samples, score.attempts, score.successes, score.compile_failures) == (40, 41, 39, 1)
        assert score.mean_log_speedup == pytest.approx(3.9)
        assert all(s.get_candidate(f"c_{i}") is not None for i in range(40))
    pooled = store.get_score("memory_bandwidth_saturated", "fuse_elementwise_chain", ALL_ARCH)
    assert pooled is not None and pooled.prior


def test_torn_journal_tail_is_ignored_then_truncated(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    with store.transaction() as tx:
        tx.put_candidate(_candidate("c_ok"))
    journal = Path(str(kb_path) + ".journal")
    good = journal.read_bytes()
    with open(journal, "ab") as f:  # what a writer killed mid-line leaves behind
        f.write(b'{"seq": 99, "ops": [["put", "candidates", "c_torn", {"cand')
    fresh = KBStore.open(kb_path)
    assert fresh.get_candidate("c_ok") is not None and fresh.get_candidate("c_torn") is None
    with fresh.transaction() as tx:
        tx.put_candidate(_candidate("c_next"))
    lines = journal.read_bytes()
    assert lines.startswith(good) and b"c_torn" not in lines and lines.endswith(b"\n")
    assert KBStore.open(kb_path).get_candidate("c_next") is not None


def test_journal_entries_already_in_file_are_not_applied_twice(kb_path: Path) -> None:
    """A crash between writing the compacted file and emptying the journal leaves folded entries."""
    store = KBStore.open(kb_path)
    journal = Path(str(kb_path) + ".journal")
    with store.transaction() as tx:
        tx.bump_transition("memory_bandwidth_saturated", "fuse_elementwise_chain", "compute_throughput_saturated")
    saved = journal.read_bytes()
    store.compact()
    assert journal.read_bytes() == b""
    journal.write_bytes(saved)  # the journal as the crash left it
    fresh = KBStore.open(kb_path)
    (tr,) = fresh.transitions("memory_bandwidth_saturated")
    assert tr.count == 1
    with fresh.transaction() as tx:
        tx.bump_transition("memory_bandwidth_saturated", "fuse_elementwise_chain", "compute_throughput_saturated")
    assert KBStore.open(kb_path).transitions("memory_bandwidth_saturated")[0].count == 2


def test_set_meta_protects_store_fields(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    with pytest.raises(ValueError):
        with store.transaction() as tx:
            tx.set_meta(applied_seq=5)
    with store.transaction() as tx:
        tx.set_meta(note="hello")
    with store.read() as kb:
        assert kb.meta["note"] == "hello"


def test_orphan_temp_files_are_removed_on_compaction(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    orphan = kb_path.with_name(kb_path.name + ".tmp-12345-deadbeef")
    orphan.write_text("half a file")
    with store.transaction() as tx:
        tx.put_candidate(_candidate("c_a"))
    store.compact()
    assert not orphan.exists()
    assert os.path.exists(kb_path)


def test_threads_sharing_one_store_lose_no_update(kb_path: Path) -> None:
    import threading

    shared = KBStore.open(kb_path)
    other = KBStore.open(kb_path)

    def bump(store: KBStore) -> None:
        for _ in range(50):
            with store.transaction() as tx:
                tx.bump_transition("memory_bandwidth_saturated", "fuse_elementwise_chain",
                                   "compute_throughput_saturated")
            store.get_state("memory_bandwidth_saturated")  # lock-free reads interleaved with the writes

    threads = [threading.Thread(target=bump, args=(s,)) for s in (shared, shared, shared, other, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert KBStore.open(kb_path).transitions("memory_bandwidth_saturated")[0].count == 250


def test_damaged_journal_entry_is_a_clear_error(kb_path: Path) -> None:
    KBStore.open(kb_path)
    journal = Path(str(kb_path) + ".journal")
    journal.write_text('{"seq": 1, "ops": [["put", "no_such_table", "k", {}]]}\n')
    with pytest.raises(KBFileError, match="journal"):
        KBStore.open(kb_path)
