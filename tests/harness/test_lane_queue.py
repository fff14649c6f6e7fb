"""The GPU lane's line (`harness.gpu.lane_queue`) between real processes: first come, first served,
each waiter told its place, and a waiter or holder that dies never wedges the line.

No GPU here: the lane's key is named outright (`KB_MCP_LANE_KEY`) in a lane folder of each test's
own, as in test_machine_lane.py, whose `Holder` processes (`lane_holder.py`) these tests use.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from test_machine_lane import Holder

from kb_mcp.harness.gpu import lane
from kb_mcp.harness.gpu.gpu_key import ENV_LANE_KEY
from kb_mcp.harness.gpu.lane_file import ENV_LANE_DIR
from kb_mcp.harness.gpu.lane_queue import LaneLine, LaneTicket


@pytest.fixture
def key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(ENV_LANE_KEY, name)
    monkeypatch.setenv(ENV_LANE_DIR, str(tmp_path / "lanes"))
    return name


def _tickets(tmp_path: Path, key: str) -> list[str]:
    return sorted(p.name for p in (tmp_path / "lanes").glob(f"{key}.t*"))


def test_waiters_of_several_processes_enter_in_the_order_they_came(tmp_path: Path, key: str) -> None:
    first = Holder(tmp_path, "first", "--until-stdin-closes", stdin=subprocess.PIPE)
    first.until("entered")
    waiters = []
    for i in range(3):  # each arrives once the one before is in line (it has said it waits)
        waiters.append(Holder(tmp_path, f"waiter{i}", "--hold-s", "0.05"))
        said = waiters[-1].next_event()
        assert said["event"] == "waiting", said
        assert said["message"].endswith(f" [place {i + 2} in line: {i + 1} ahead]"), said
        assert f"pid {first.proc.pid}," in said["message"], said
    assert first.proc.stdin is not None
    first.proc.stdin.close()
    spans = lane.read_spans(first.finish() + "".join(w.finish() for w in waiters))
    entered = [s.what for s in sorted(spans, key=lambda s: s.start)]
    assert entered == ["first", "waiter0", "waiter1", "waiter2"]
    by_what = {s.what: s for s in spans}
    assert [by_what[f"waiter{i}"].place for i in range(3)] == [1, 2, 3]
    tickets = [by_what[w].ticket for w in entered]
    assert tickets == sorted(tickets) and len(set(tickets)) == 4
    assert lane.overlapping(spans) == []
    assert _tickets(tmp_path, key) == []  # every ticket left with its holder


def test_a_process_coming_back_at_once_goes_behind_a_thread_that_waited(tmp_path: Path, key: str) -> None:
    """A process holding the lane back to back (an eval) lets in a waiter that came meanwhile, every time."""
    busy = Holder(tmp_path, "busy", "--times", "3", "--hold-s", "0.4")
    busy.until("entered")
    entered: list[float] = []
    for _ in range(2):
        with lane.hold("agent"):
            entered.append(time.monotonic())
    spans = lane.read_spans(busy.finish())
    # Each of this thread's holds came while busy held the lane: busy's next hold had to wait for it.
    first_busy_end = min(s.end for s in spans)
    assert entered[0] >= first_busy_end
    assert sum(1 for s in spans if s.start < entered[0]) == 1, "busy went twice before a waiter that came first"


def test_a_killed_waiter_leaves_no_ticket_that_blocks_the_line(tmp_path: Path, key: str) -> None:
    holder = Holder(tmp_path, "holder", "--until-stdin-closes", stdin=subprocess.PIPE)
    holder.until("entered")
    doomed = Holder(tmp_path, "doomed")
    assert doomed.next_event()["event"] == "waiting"  # in line, behind the holder
    doomed.proc.send_signal(signal.SIGKILL)
    assert doomed.proc.wait(10) == -signal.SIGKILL
    assert len(_tickets(tmp_path, key)) == 2  # its ticket is still there, stale
    assert holder.proc.stdin is not None
    holder.proc.stdin.close()
    holder.finish()
    got_in = threading.Event()

    def enter() -> None:
        with lane.hold("after"):
            got_in.set()

    t = threading.Thread(target=enter)
    t.start()
    assert got_in.wait(5), "a dead waiter's ticket kept the lane from its next waiter"
    t.join()
    assert _tickets(tmp_path, key) == []  # reaped on the way


def test_a_holder_killed_with_waiters_behind_it_lets_the_first_in(tmp_path: Path, key: str) -> None:
    holder = Holder(tmp_path, "holder", "--until-stdin-closes", stdin=subprocess.PIPE)
    holder.until("entered")
    waiter = Holder(tmp_path, "waiter")
    assert waiter.next_event()["event"] == "waiting"
    holder.proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    assert waiter.until("entered")[-1]["hold"]["place"] == 1
    assert time.monotonic() - killed < 3.0
    waiter.finish()


def test_a_ticket_is_alive_while_its_taker_holds_it_and_stale_after(tmp_path: Path) -> None:
    folder = tmp_path / "lanes"
    folder.mkdir()
    line = LaneLine(folder, "g")
    record = LaneTicket(what="x", pid=os.getpid(), host="h", since=time.time())
    a, b, c = (line.join(record.model_copy(update={"what": w})) for w in "abc")
    assert [a.number, b.number, c.number] == [0, 1, 2]
    assert [t.what for t in line.ahead(c)] == ["a", "b"]
    os.close(b.fd)  # b's taker is gone without leaving (as a killed process's descriptors close)
    b.fd = None
    assert [t.what for t in line.ahead(c)] == ["a"] and not b.path.exists()
    line.leave(a)
    assert line.ahead(c) == []
    (folder / "g.next").write_text("garbled")  # a counter nobody can read: the tickets present still order
    d = line.join(record)
    assert d.number == 3 and [t.what for t in line.ahead(d)] == ["c"]
