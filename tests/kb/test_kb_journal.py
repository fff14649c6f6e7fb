"""The journal (kb.journal) through the store: checksummed lines, damage refused with file, line and
offset (never read past, never truncated), old lines still read, and appends that refuse rather
than overwrite what another writer put there."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from kb_mcp.kb import journal
from kb_mcp.kb.errors import KBConflictError, KBCorruptError, KBNewerFormatError
from kb_mcp.kb.models import CandidateRecord, Verdict
from kb_mcp.kb.store import KBStore


def _candidate(cid: str) -> CandidateRecord:
    return CandidateRecord(candidate_id=cid, problem="p", problem_hash="h", verdict=Verdict.faster, arch="sm_90",
                           time_ms=1.0, eager_ms=2.0)


def _ten_transactions(kb_path: Path) -> Path:
    store = KBStore.open(kb_path)
    for i in range(10):
        with store.transaction() as tx:
            tx.put_candidate(_candidate(f"c_{i}"))
    j = Path(str(kb_path) + ".journal")
    assert len(j.read_bytes().splitlines()) == 10
    return j


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_lines_carry_a_checksum_and_the_offset_they_were_written_at(kb_path: Path) -> None:
    j = _ten_transactions(kb_path)
    offset = 0
    for raw in j.read_bytes().splitlines(keepends=True):
        assert raw.startswith(b'{"crc":"')
        doc = json.loads(raw)
        assert doc["at"] == offset and journal.decode(raw[:-1]).seq == doc["seq"]
        offset += len(raw)


@pytest.mark.parametrize("where", ["digit", "structure"])
def test_a_flipped_byte_in_line_3_is_refused_with_file_line_and_offset_and_nothing_is_cut(
    kb_path: Path, where: str
) -> None:
    j = _ten_transactions(kb_path)
    lines = j.read_bytes().splitlines(keepends=True)
    start = sum(len(x) for x in lines[:2])
    inside = lines[2].index(b'"time_ms":1.0') + len(b'"time_ms":') if where == "digit" else lines[2].index(b"[")
    _flip(j, start + inside)
    damaged = j.read_bytes()

    with pytest.raises(KBCorruptError) as err:
        KBStore.open(kb_path)
    e = err.value
    assert e.line == 3 and e.offset == start and e.where == str(j)
    assert str(j) in str(e) and "line 3" in str(e) and f"byte offset {start}" in str(e) and "kb repair" in str(e)
    assert e.whose == "environment"
    assert e.copy is not None and Path(e.copy).read_bytes() == damaged  # a copy is kept

    # a store that had the KB open before the damage refuses too, and writes nothing
    with pytest.raises(KBCorruptError):
        with KBStore(kb_path).transaction() as tx:
            tx.put_candidate(_candidate("c_new"))
    assert j.read_bytes() == damaged, "the damaged journal must never be truncated or appended to"


def test_a_damaged_last_complete_line_is_damage_too_only_an_incomplete_one_is_ignored(kb_path: Path) -> None:
    j = _ten_transactions(kb_path)
    data = j.read_bytes()
    _flip(j, len(data) - 5)
    with pytest.raises(KBCorruptError, match="line 10"):
        KBStore.open(kb_path)
    j.write_bytes(data + data.splitlines(keepends=True)[0][:40])  # a torn write: no newline
    store = KBStore.open(kb_path)
    assert store.stats().candidates == 10
    with store.transaction() as tx:
        tx.put_candidate(_candidate("c_after"))
    assert j.read_bytes().startswith(data) and KBStore.open(kb_path).stats().candidates == 11


def test_lines_of_the_older_format_without_checksums_still_load(kb_path: Path) -> None:
    KBStore.open(kb_path)
    j = Path(str(kb_path) + ".journal")
    old = [json.dumps({"seq": i + 1, "ops": [["put", "candidates", f"c_old{i}",
                                              _candidate(f"c_old{i}").model_dump(mode="json")]]})
           for i in range(3)]
    j.write_text("".join(line + "\n" for line in old))
    store = KBStore.open(kb_path)
    assert all(store.get_candidate(f"c_old{i}") is not None for i in range(3))
    with store.transaction() as tx:  # a new line continues an old journal
        tx.put_candidate(_candidate("c_new"))
    fresh = KBStore.open(kb_path)
    assert fresh.stats().candidates == 4 and j.read_text().splitlines()[-1].startswith('{"crc":')


def test_a_line_cut_out_of_the_middle_is_damage_not_a_retry(kb_path: Path) -> None:
    j = _ten_transactions(kb_path)
    lines = j.read_bytes().splitlines(keepends=True)
    j.write_bytes(b"".join(lines[:4] + lines[5:]))  # transaction 5 cut out of the middle
    with pytest.raises(KBCorruptError) as err:
        KBStore.open(kb_path)
    assert err.value.line == 5 and f"was written at byte offset {sum(map(len, lines[:5]))}" in str(err.value)
    assert "try again" not in str(err.value)


def test_a_sequence_gap_in_old_lines_is_damage_too(kb_path: Path) -> None:
    KBStore.open(kb_path)
    j = Path(str(kb_path) + ".journal")
    j.write_text("".join(json.dumps({"seq": s, "ops": []}) + "\n" for s in (1, 2, 4)))
    with pytest.raises(KBCorruptError) as err:
        KBStore.open(kb_path)
    assert "transaction 4 where 3 was expected" in str(err.value) and err.value.line == 3


def test_an_append_refuses_when_another_writer_put_a_complete_entry_there(kb_path: Path) -> None:
    store = KBStore.open(kb_path)
    with store.transaction() as tx:
        tx.put_candidate(_candidate("c_0"))
    j = Path(str(kb_path) + ".journal")
    intruder = journal.encode(journal.Entry(2, [["put", "candidates", "c_other",
                                                 _candidate("c_other").model_dump(mode="json")]],
                                            at=j.stat().st_size))
    with pytest.raises(KBConflictError, match="did not expect"):
        with store.transaction() as tx:
            tx.put_candidate(_candidate("c_mine"))
            with open(j, "ab") as f:  # a writer that ignored the lock, between our read and our append
                f.write(intruder)
    assert j.read_bytes().endswith(intruder), "the other writer's entry must not be cut"
    fresh = KBStore.open(kb_path)
    assert fresh.get_candidate("c_other") is not None and fresh.get_candidate("c_mine") is None


def test_a_line_that_lost_a_race_is_skipped_and_the_winner_and_later_lines_count(kb_path: Path) -> None:
    KBStore.open(kb_path)
    j = Path(str(kb_path) + ".journal")

    def put(cid: str) -> list[list[object]]:
        return [["put", "candidates", cid, _candidate(cid).model_dump(mode="json")]]

    winner = journal.encode(journal.Entry(1, put("c_winner"), at=0))
    loser = journal.encode(journal.Entry(1, put("c_loser"), at=0))  # expected byte 0, landed after the winner
    later = journal.encode(journal.Entry(2, put("c_later"), at=len(winner) + len(loser)))
    j.write_bytes(winner + loser + later)
    store = KBStore.open(kb_path)
    assert store.get_candidate("c_winner") and store.get_candidate("c_later") and store.get_candidate("c_loser") is None


def test_a_line_holding_a_nan_is_damage_even_with_a_checksum_made_for_it(kb_path: Path) -> None:
    KBStore.open(kb_path)
    j = Path(str(kb_path) + ".journal")
    doc = _candidate("c_nan").model_dump(mode="json") | {"time_ms": float("nan")}
    body = json.dumps({"seq": 1, "at": 0, "ops": [["put", "candidates", "c_nan", doc]]})
    legacy = json.dumps({"seq": 1, "ops": [["put", "candidates", "c_nan", doc]]}) + "\n"
    assert "NaN" in body  # python's json writes it, and would read it back
    for line in (legacy, _checksummed(body)):
        j.write_text(line)
        with pytest.raises(KBCorruptError, match=r"line 1.*NaN is not a JSON number \(at ops/0/3/time_ms\)"):
            KBStore.open(kb_path)


def _checksummed(body: str) -> str:
    """`body` as a journal line of today's format, its checksum computed for exactly that text."""
    tail = body.encode()[1:]
    return (journal._CRC_PREFIX + b'%08x",' % zlib.crc32(tail) + tail + b"\n").decode()


def _append_checksummed(j: Path, fields: dict[str, object]) -> bytes:
    """Appends a line checksummed like the journal's own (`journal.encode`), with `fields` added."""
    data = j.read_bytes()
    last = journal.decode(data.splitlines()[-1]).seq
    body = json.dumps({"seq": last + 1, "at": len(data), "ops": [], **fields}, separators=(",", ":")).encode()[1:]
    j.write_bytes(data + b'{"crc":"%08x",%s\n' % (zlib.crc32(body), body))
    return j.read_bytes()


def test_a_checksummed_line_with_a_field_of_a_newer_kb_mcp_is_refused_as_newer_not_damaged(kb_path: Path) -> None:
    j = _ten_transactions(kb_path)
    written = _append_checksummed(j, {"frobnicate": 1, "by": "kernel-kb-mcp 9.0"})
    with pytest.raises(KBNewerFormatError) as err:
        KBStore.open(kb_path)
    e = err.value
    assert e.line == 11 and e.where == str(j) and "frobnicate" in e.found and e.whose == "environment"
    assert "kernel-kb-mcp 9.0" in str(e) and "upgrade kb-mcp on this machine" in str(e).lower()
    assert j.read_bytes() == written and not list(kb_path.parent.glob("*.damaged-*"))


def test_a_line_naming_its_writer_is_read_and_the_writer_named_when_its_op_is_newer(kb_path: Path) -> None:
    j = _ten_transactions(kb_path)
    _append_checksummed(j, {"by": "kernel-kb-mcp 9.0"})
    assert KBStore.open(kb_path).stats()  # "by" is the one field a line may add: it reads
    _append_checksummed(j, {"by": "kernel-kb-mcp 9.1", "ops": [["frobnicate", "states", "s1"]]})
    with pytest.raises(KBNewerFormatError, match=r"frobnicate.*kernel-kb-mcp 9\.1") as err:
        KBStore.open(kb_path)
    assert err.value.line == 12
