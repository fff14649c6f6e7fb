"""The census worker on any machine: real worker processes, real candidate code.

Without CUDA the census itself says it saw no GPU, but everything around it runs as on a GPU
machine: the census worker is a process of its own (`--role census`), the candidate is imported,
constructed and run there, faults and timeouts there cost the census worker only (the verify
worker keeps its pid), tampering there is reported and retires it, and the verify worker never
starts a profiler session. The verify worker's side of the exchange (`await_census`) runs here
on a real socket pair.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kb_mcp.harness.census import CensusReply
from kb_mcp.harness.channel import POOL_KEY, FrameReader, send
from kb_mcp.harness.verdict import FindingCode, VerifyOptions
from kb_mcp.harness.worker import WorkerPool
from kb_mcp.harness.worker_main import await_census
from kb_mcp.kb.models import Verdict

# Runs on CPU tensors (the census worker has no GPU here); FORWARD is replaced per test.
CANDIDATE = '''
import os
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        FORWARD
        return torch.clamp(x, min=0)
'''


def _candidate(forward: str = "pass") -> str:
    body = "\n        ".join(forward.strip().splitlines())
    return CANDIDATE.replace("FORWARD", body)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerPool]:
    with WorkerPool(tmp_path_factory.mktemp("census-cache"), no_cuda=True, spare=False) as p:
        yield p


def test_the_census_runs_the_forward_in_a_process_of_its_own(pool: WorkerPool, relu_problem, tmp_path: Path) -> None:
    marker = tmp_path / "forward-ran-in"
    reply = pool.census(relu_problem, _candidate(f"open({str(marker)!r}, 'a').write(str(os.getpid()) + ' ')"))
    assert reply.clean, reply
    assert reply.census is not None and reply.census["available"] is False and "no CUDA" in reply.census["note"]
    state = pool.state()
    census_pid, verify_pid = state["census"]["info"]["pid"], state["verify"]["info"]["pid"]
    assert state["census"]["info"]["role"] == "census" and state["verify"]["info"]["role"] == "verify"
    assert reply.pid == census_pid and len({census_pid, verify_pid, os.getpid()}) == 3
    # forward ran twice there (a first call, then the censused one), and nowhere else
    assert marker.read_text().split() == [str(census_pid)] * 2
    assert state["verify"]["profiler_sessions"] == 0


@pytest.mark.parametrize(
    ("forward", "verdict", "words"),
    [
        ("import ctypes\nctypes.string_at(0)", Verdict.crashed, "killed by SIGSEGV"),
        ("while True:\n    pass", Verdict.timeout, "no answer within 3 s while running forward for the kernel census"),
    ],
    ids=["segfault", "hang"],
)
def test_a_fault_in_the_census_costs_the_census_worker_only(
    pool: WorkerPool, relu_problem, forward: str, verdict: Verdict, words: str
) -> None:
    verify_pid = pool.state()["verify"]["info"]["pid"]
    restarts = pool.census_restarts
    t0 = time.monotonic()
    reply = pool.census(relu_problem, _candidate(forward), VerifyOptions(timeout_s=3))
    assert reply.verdict == verdict and words in reply.summary, reply.summary
    assert "census" in reply.summary and time.monotonic() - t0 < 60
    assert pool.census_restarts == restarts + 1
    assert pool.census(relu_problem, _candidate()).clean
    assert pool.state()["verify"]["info"]["pid"] == verify_pid


def test_tampering_and_threads_in_the_census_worker_are_findings_and_retire_it(pool: WorkerPool, relu_problem) -> None:
    forward = (
        "import threading, time\n"
        "time.perf_counter = lambda: 0.0\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()"
    )
    restarts = pool.census_restarts
    reply = pool.census(relu_problem, _candidate(forward))
    assert reply.verdict is None and not reply.clean
    codes = {f.code for f in reply.findings}
    assert codes == {FindingCode.harness_tampering, FindingCode.background_thread}, reply.findings
    assert any("time.perf_counter" in f.message for f in reply.findings)
    assert pool.census_restarts == restarts + 1
    assert pool.census(relu_problem, _candidate()).clean


def test_the_verify_worker_reads_the_census_answer_of_its_own_request() -> None:
    pool_end, worker_end = socket.socketpair()
    try:
        reader = FrameReader(worker_end)
        reply = CensusReply(census={"available": True, "own": ["k"]}, pid=7)
        send(pool_end, {"op": "census", "rid": "r1", "reply": reply.model_dump(mode="json")}, POOL_KEY)
        assert CensusReply.model_validate(await_census(reader, "r1")) == reply
        send(pool_end, {"op": "census", "rid": "another", "reply": reply.model_dump(mode="json")}, POOL_KEY)
        with pytest.raises(RuntimeError, match="census"):
            await_census(reader, "r1")
        send(pool_end, {"op": "verify", "rid": "r1"}, POOL_KEY)
        with pytest.raises(RuntimeError, match="'verify'"):
            await_census(reader, "r1")
    finally:
        pool_end.close()
        worker_end.close()


def test_before_a_timed_series_the_pool_waits_for_workers_still_starting(tmp_path: Path) -> None:
    """What the pool does between the census and the timing (`_settle_starts`): a spare that has not
    said hello yet is waited for, so its CUDA start-up cannot overlap the verify worker's timed runs."""
    with WorkerPool(tmp_path, no_cuda=True) as p:
        p.info()  # the active worker is up; the spare beside it has not been heard from
        spare = p._spare
        assert spare is not None and spare.starting()
        p._settle_starts()
        assert not spare.starting() and spare.alive() and spare.info and spare.info["role"] == "verify"
        assert spare.info["pid"] != p.info()["pid"]
