"""The machine-wide GPU lane (`harness.gpu.lane`), between real processes on this machine.

There is no GPU here, so the lane's key is named outright (`KB_MCP_LANE_KEY`, as documented), in a
lane folder of each test's own (`KB_MCP_LANE_DIR`): everything else is what runs on a GPU machine
(the lock file, `flock`, the holder's record, the logs). The processes are `lane_holder.py`; their
holds are read back from their logs (`read_spans`), on the machine-wide monotonic clock.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

import pytest

from kb_mcp.harness.gpu import lane
from kb_mcp.harness.gpu.gpu_key import ENV_LANE_KEY
from kb_mcp.harness.gpu.lane_file import ENV_LANE_DIR, LaneFile

HOLDER = Path(__file__).with_name("lane_holder.py")


@pytest.fixture
def key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A GPU key of this test's own, in a lane folder of its own, named for this process too."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(ENV_LANE_KEY, name)
    monkeypatch.setenv(ENV_LANE_DIR, str(tmp_path / "lanes"))
    return name


class Holder:
    """A lane_holder.py process: its events (stdout, JSON lines) and its log (stderr, a file)."""

    def __init__(self, tmp_path: Path, what: str, *args: str, env: dict[str, str] | None = None,
                 stdin: int | None = subprocess.DEVNULL, **popen: Any) -> None:
        self.log = tmp_path / f"{what}.log"
        self.proc = subprocess.Popen([popen.pop("python", sys.executable), str(HOLDER), what, *args],
                                     stdin=stdin, stdout=subprocess.PIPE, stderr=self.log.open("wb"), text=True,
                                     env={**os.environ, **(env or {})}, **popen)
        assert self.proc.stdout is not None
        self.out: IO[str] = self.proc.stdout

    def next_event(self, timeout_s: float = 30) -> dict[str, Any]:
        """The next event it printed (raises if it printed none in time)."""
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.out.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not box or not box[0]:
            raise AssertionError(f"no event from {self.proc.args}: {self.log.read_text(errors='replace')}")
        event: dict[str, Any] = json.loads(box[0])
        return event

    def until(self, name: str) -> list[dict[str, Any]]:
        """Events up to and including the first `name`."""
        seen = [self.next_event()]
        while seen[-1]["event"] != name:
            seen.append(self.next_event())
        return seen

    def finish(self) -> str:
        """Waits for it to exit cleanly; returns its log."""
        assert self.proc.wait(60) == 0, self.log.read_text(errors="replace")
        return self.log.read_text(errors="replace")


def test_processes_on_one_gpu_take_turns(tmp_path: Path, key: str) -> None:
    holders = [Holder(tmp_path, f"holder{i}", "--times", "4", "--hold-s", "0.05") for i in range(3)]
    spans = lane.read_spans("".join(h.finish() for h in holders))
    assert len(spans) == 12 and {s.pid for s in spans} == {h.proc.pid for h in holders}
    assert all(s.machine and s.gpu == key for s in spans)
    assert lane.overlapping(spans) == []
    assert sum(s.waited_s for s in spans) > 0.05  # they did contend


def test_a_process_holding_back_to_back_lets_a_waiter_in_next(tmp_path: Path, key: str) -> None:
    """An eval verifying problem after problem does not starve a server's call that waits."""
    busy = Holder(tmp_path, "busy", "--times", "4", "--hold-s", "1.0")
    busy.until("entered")
    waiter = Holder(tmp_path, "waiter", "--times", "1")
    spans = lane.read_spans(busy.finish() + waiter.finish())
    (waited,) = [s for s in spans if s.what == "waiter"]
    arrived = waited.start - waited.waited_s
    passed_it = [s for s in spans if s.what == "busy" and arrived < s.start < waited.start]
    assert len(passed_it) <= 1, f"{len(passed_it)} holds of the busy process went before a waiter that came first"
    assert lane.overlapping(spans) == []


def test_processes_on_two_gpus_run_side_by_side(tmp_path: Path, key: str) -> None:
    """The lane is per GPU; and the overlap check finds overlaps where there are some."""
    holders = [Holder(tmp_path, f"holder{i}", "--times", "2", "--hold-s", "0.5", env={ENV_LANE_KEY: f"{key}-{i}"})
               for i in range(2)]
    spans = lane.read_spans("".join(h.finish() for h in holders))
    assert {s.gpu for s in spans} == {f"{key}-0", f"{key}-1"} and lane.overlapping(spans) == []
    as_one_gpu = [s.model_copy(update={"gpu": key}) for s in spans]
    assert lane.overlapping(as_one_gpu), "two GPUs' holds ran side by side: on one GPU they would overlap"


def test_a_killed_holder_releases_the_lane_at_once_and_a_waiter_is_told_who_held_it(
        tmp_path: Path, key: str) -> None:
    # It started a process while holding the lane (as a server starts workers and compilers), which
    # lives on after it is killed: the lock must not live on in it.
    holder = Holder(tmp_path, "killed_holder", "--until-stdin-closes", "--child", stdin=subprocess.PIPE)
    entered = holder.until("entered")[-1]
    held, child = entered["hold"], entered["child"]
    assert held["machine"] and held["gpu"] == key
    said: list[str] = []
    got_in = threading.Event()
    killed_at: list[float] = []

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        said.append(message or "")
        if not killed_at:
            killed_at.append(time.monotonic())
            holder.proc.send_signal(signal.SIGKILL)  # no chance to release anything itself

    def waiter() -> None:
        with lane.hold("compile_and_verify", progress) as mine:
            assert mine.machine
            got_in.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        assert got_in.wait(10), said
        took = time.monotonic() - killed_at[0]
        thread.join()
        assert holder.proc.wait(10) == -signal.SIGKILL
        os.kill(child, 0)  # the child still runs
    finally:
        os.kill(child, signal.SIGKILL)
    assert took < 1.0, f"the lane stayed locked {took:.2f} s after its holder was killed"
    assert said[0].startswith(f"waiting for the GPU {key}: killed_holder (`lane_holder.py killed_holder ")
    assert f"pid {holder.proc.pid}," in said[0] and " UTC, " in said[0], said


def test_a_second_thread_waits_behind_the_first_and_hears_its_place(tmp_path: Path, key: str) -> None:
    """Threads of one process stand in the machine-wide line one by one, in the order they came."""
    other = Holder(tmp_path, "other", "--until-stdin-closes", stdin=subprocess.PIPE)
    other.until("entered")
    first_waits = threading.Event()
    order: list[str] = []

    def first() -> None:
        with lane.hold("profile relu", lambda *_: first_waits.set()):
            order.append("profile relu")

    thread = threading.Thread(target=first)
    thread.start()
    assert first_waits.wait(10)
    said: list[str] = []

    def second_progress(done: float, total: float | None = None, message: str | None = None) -> None:
        said.append(message or "")
        assert other.proc.stdin is not None
        other.proc.stdin.close()  # the other process leaves: the first thread goes, then this one

    with lane.hold("compile_and_verify", second_progress) as held:
        assert held.machine and held.place == 2 and held.waited_s > 0
        order.append("compile_and_verify")
    thread.join()
    other.finish()
    assert order == ["profile relu", "compile_and_verify"]
    assert said[0].startswith(f"waiting for the GPU {key}: other (`lane_holder.py other ")
    assert said[0].endswith(" [place 3 in line: 2 ahead]"), said


def test_a_hold_records_its_holder_and_empties_the_record_as_it_leaves(tmp_path: Path, key: str) -> None:
    lane_file = LaneFile(tmp_path / "lanes", key)
    with lane.hold("profile relu") as held:
        record = lane_file.holder()
        assert record is not None and (record.pid, record.what, record.gpu) == (os.getpid(), "profile relu", key)
        assert abs(record.since - held.since) < 1
    assert lane_file.holder() is None and lane_file.path.stat().st_size == 0


def test_holds_are_reentrant_and_logged_once(key: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kb_mcp.harness.gpu.lane")
    with lane.hold("compile_and_verify") as outer:
        with lane.hold("verify relu") as inner:  # the harness's hold inside a tool's
            assert inner is outer and lane.current() is outer
        assert lane.current() is outer
    assert lane.current() is None
    spans = lane.read_spans(caplog.text)
    assert [(s.what, s.gpu, s.machine, s.pid) for s in spans] == [("compile_and_verify", key, True, os.getpid())]


def test_without_a_gpu_the_lane_is_the_process_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_LANE_KEY, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hides every GPU, on any machine
    monkeypatch.setenv(ENV_LANE_DIR, str(tmp_path / "lanes"))
    with lane.hold("compile_and_verify") as held:
        assert not held.machine and not held.alone and held.gpu == ""
        assert held.why_not == "no GPU is visible to this process"
    assert not (tmp_path / "lanes").exists()  # nothing machine-wide was touched


def test_the_lane_folder_and_files_are_shared_like_tmp(tmp_path: Path, key: str) -> None:
    old = os.umask(0o077)  # a private umask must not make the lane private
    try:
        with lane.hold("compile_and_verify") as held:
            assert held.machine
    finally:
        os.umask(old)
    folder = tmp_path / "lanes"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o1777
    assert stat.S_IMODE((folder / f"{key}.lock").stat().st_mode) == 0o666


def test_an_unusable_lane_folder_leaves_the_hold_in_this_process_and_says_why(
        tmp_path: Path, key: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    not_a_folder = tmp_path / "lanes-file"
    not_a_folder.write_text("")
    monkeypatch.setenv(ENV_LANE_DIR, str(not_a_folder))
    with caplog.at_level(logging.WARNING, logger="kb_mcp.harness.gpu.lane"), lane.hold("compile_and_verify") as held:
        assert not held.machine and held.gpu == key
        assert str(not_a_folder) in held.why_not and ENV_LANE_DIR in held.why_not
    assert "do not take turns with other processes" in caplog.text


def test_a_lock_file_that_is_a_link_is_never_followed(tmp_path: Path, key: str) -> None:
    folder = tmp_path / "lanes"
    with lane.hold("first"):
        pass  # makes the folder
    (folder / f"{key}.lock").unlink()
    precious = tmp_path / "precious.txt"
    precious.write_text("someone's data")
    (folder / f"{key}.lock").symlink_to(precious)
    with lane.hold("compile_and_verify") as held:
        assert not held.machine and "lock file" in held.why_not
    assert precious.read_text() == "someone's data"


def test_read_spans_refuses_a_log_it_cannot_pair() -> None:
    entry = ("gpu lane: a entered after waiting 0.000 s [gpu=g scope=machine pid=1 t=1.0 "
             "wall=2026-01-01T00:00:00.000000+00:00 thread=T]\n")
    leave = ("gpu lane: a left after 1.000 s [gpu=g scope=machine pid=1 t=2.0 "
             "wall=2026-01-01T00:00:01.000000+00:00 thread=T]\n")
    assert len(lane.read_spans(entry + leave)) == 1
    with pytest.raises(ValueError, match="never left"):
        lane.read_spans(entry)
    with pytest.raises(ValueError, match="without its entry"):
        lane.read_spans(leave)
    with pytest.raises(ValueError, match="twice"):
        lane.read_spans(entry + entry)


# -- two users --------------------------------------------------------------------------------

NOBODY = 65534


def _python_for_nobody(folder: Path) -> tuple[str, dict[str, str]] | None:
    """An interpreter and environment with which user nobody can import kb_mcp, None if none."""
    import pydantic

    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": os.pathsep.join([str(root / ".mypy-src"), str(Path(pydantic.__file__).parents[1])])}
    for python in (sys.executable, "/usr/bin/python3"):
        try:
            probe = subprocess.run([python, "-c", "import kb_mcp.harness.gpu.lane"], user=NOBODY, group=NOBODY,
                                   cwd=folder, env={**os.environ, **env}, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return python, env
    return None


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a process as a second user")
def test_two_users_processes_take_turns_on_one_lane(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A folder the second user can reach (pytest's own are private to this user).
    base = Path(tempfile.mkdtemp(prefix="kb-mcp-lane-test-", dir="/tmp"))
    try:
        base.chmod(0o755)
        monkeypatch.setenv(ENV_LANE_DIR, str(base / "lanes"))
        found = _python_for_nobody(base)
        if found is None:
            pytest.skip("no interpreter that user nobody can run with kb_mcp importable")
        python, env = found
        with lane.hold("first user's timing"):  # this user makes the folder and the lock file
            other = Holder(base, "second_user", "--until-stdin-closes", stdin=subprocess.PIPE, python=python,
                           env={**env, ENV_LANE_DIR: str(base / "lanes")}, user=NOBODY, group=NOBODY, cwd=base)
            waiting = other.next_event()
            assert waiting["event"] == "waiting" and f"pid {os.getpid()}," in waiting["message"], waiting
        assert other.until("entered")[-1]["hold"]["machine"]
        said: list[str] = []

        def release_on_first_report(done: float, total: float | None = None, message: str | None = None) -> None:
            said.append(message or "")
            if len(said) == 1:
                assert other.proc.stdin is not None
                other.proc.stdin.close()

        with lane.hold("first user's second timing", release_on_first_report) as again:
            assert again.machine
        assert f"pid {other.proc.pid}," in said[0] and "user nobody" in said[0], said
        assert other.until("left")
        other.finish()
    finally:
        shutil.rmtree(base, ignore_errors=True)
