"""The census worker on any machine: real worker processes, real candidate code.

Without CUDA the census itself says it saw no GPU, but everything around it runs as on a GPU
machine: the census worker is a process of its own (`--role census`), the candidate is imported,
constructed and run there, faults and timeouts there cost the census worker only (the verify
worker keeps its pid), tampering there is reported and retires it, and the verify worker never
starts a profiler session. The verify worker's side of the exchange (`await_census`) runs here
on a real socket pair. Each worker runs in its own sandbox (own pid namespace: pids are compared as
the pool sees them).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kb_mcp.harness.judgment.verdict import FindingCode, VerifyOptions
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.protocol import BuildAnswer, BuildReply, CensusAnswer, CensusReply
from kb_mcp.harness.sandbox.channel import POOL_KEY, send
from kb_mcp.harness.worker.main import Channel
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


def test_the_census_runs_the_forward_in_a_process_of_its_own(pool: WorkerPool, relu_problem) -> None:
    # The sandbox's home is its scratch folder, which the pool can look into.
    forward = "open(os.path.expanduser('~/forward-ran-in'), 'a').write(str(os.getpid()) + ' ')"
    reply = pool.census(relu_problem, _candidate(forward))
    assert reply.clean, reply
    assert reply.census is not None and reply.census["available"] is False and "no CUDA" in reply.census["note"]
    state = pool.state()
    census, verify = state["census"].info, state["verify"].info
    assert census.role == "census" and verify.role == "verify"
    assert reply.pid == census.sandbox_pid and len({census.pid, verify.pid, os.getpid()}) == 3
    # forward ran twice there (a first call, then the censused one), and nowhere else
    assert pool._census is not None
    assert (pool._census.scratch / "forward-ran-in").read_text().split() == [str(census.sandbox_pid)] * 2
    assert state["verify"].profiler_sessions == 0
    # no device time without a GPU, and the reference's only where asked for
    assert reply.device is not None and reply.device.ms is None and "no CUDA device" in reply.device.note
    assert reply.reference_device is None


def test_the_reference_device_time_is_measured_there_where_asked_for(pool: WorkerPool, relu_problem) -> None:
    reply = pool.census(relu_problem, _candidate(), reference_device=True)
    assert reply.clean, reply
    assert reply.reference_device is not None and reply.reference_device.ms is None
    assert "no CUDA device" in reply.reference_device.note


def test_the_reference_device_time_is_taken_where_no_candidate_has_run(pool: WorkerPool, relu_problem) -> None:
    # A mark no integrity check looks for (plain data), and a note of whether the process has it.
    forward = (
        "import builtins\n"
        "open(os.path.expanduser('~/marked'), 'a').write(str(hasattr(builtins, '_kbmcp_mark')) + ' ')\n"
        "builtins._kbmcp_mark = 1"
    )
    assert pool.census(relu_problem, _candidate(forward)).clean
    touched = pool.state()["census"].info.pid
    restarts = pool.census_restarts

    reply = pool.census(relu_problem, _candidate(forward), reference_device=True)
    assert reply.clean and reply.reference_device is not None, reply
    fresh = pool.state()["census"].info.pid
    assert fresh != touched and pool.census_restarts == restarts  # a fresh worker, not a fault's replacement
    assert pool._census is not None
    # forward runs twice per census: no mark before its first call there, its own after
    assert (pool._census.scratch / "marked").read_text().split() == ["False", "True"]

    assert pool.census(relu_problem, _candidate(forward)).clean  # without the reference: kept
    assert pool.state()["census"].info.pid == fresh
    assert (pool._census.scratch / "marked").read_text().split() == ["False", "True", "True", "True"]


def test_an_untouched_census_worker_is_started_ahead_only_where_the_census_will_want_one(
        tmp_path: Path, relu_problem) -> None:
    """`_census_ahead` (called as a verification's checks begin) starts the fresh census worker a
    first verdict's census wants, so its start overlaps the checks; that census then takes it as it
    is. Where nothing of the reference is wanted any more, the served census worker is kept."""
    with WorkerPool(tmp_path, no_cuda=True, spare=False) as pool:
        w = pool._ready()
        assert pool.census(relu_problem, _candidate()).clean
        served = pool._census
        assert served is not None and served.served
        restarts = pool.census_restarts
        pool._census_ahead(w, relu_problem, VerifyOptions())
        ahead = pool._census
        assert ahead is not None and ahead is not served and not ahead.served and not served.alive()
        assert pool.census_restarts == restarts  # not counted as a fault's replacement
        reply = pool.census(relu_problem, _candidate(), reference_device=True)
        assert reply.clean and pool._census is ahead and ahead.served == 1  # taken as it was, no second start
        # No CUDA here: that clean census found the reference's device time unknown, so it is not asked again.
        pool._census_ahead(w, relu_problem, VerifyOptions())
        assert pool._census is ahead
        # Composed mode's first census takes the reference's op set: a fresh worker again.
        pool._census_ahead(w, relu_problem, VerifyOptions(mode="composed"))
        assert pool._census is not ahead and not pool._census.served


def test_a_reference_device_time_a_clean_census_answered_is_not_asked_again(tmp_path: Path, relu_problem) -> None:
    # Unknown here (no CUDA) as where the profiler sees no device durations: asking at every
    # verification would start a fresh census worker for each candidate.
    with WorkerPool(tmp_path, no_cuda=True, spare=False) as pool:
        options = VerifyOptions()
        assert pool.reference_device_wanted(relu_problem, options, None)
        assert pool.census(relu_problem, _candidate("raise RuntimeError('no')"), reference_device=True).failure
        assert pool.reference_device_wanted(relu_problem, options, None)  # that census was not clean
        reply = pool.census(relu_problem, _candidate(), reference_device=True)
        assert reply.clean and reply.reference_device is not None and reply.reference_device.ms is None
        assert not pool.reference_device_wanted(relu_problem, options, None)
        assert pool.reference_device_wanted(relu_problem, VerifyOptions(track="tf32"), None)  # per track


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
    verify_pid = pool.state()["verify"].info.pid
    restarts = pool.census_restarts
    t0 = time.monotonic()
    reply = pool.census(relu_problem, _candidate(forward), VerifyOptions(timeout_s=3))
    assert reply.verdict == verdict and words in reply.summary, reply.summary
    assert "census" in reply.summary and time.monotonic() - t0 < 60
    assert pool.census_restarts == restarts + 1
    assert pool.census(relu_problem, _candidate()).clean
    assert pool.state()["verify"].info.pid == verify_pid


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


def test_a_loosened_harness_table_is_tampering_in_a_real_worker(pool: WorkerPool, relu_problem) -> None:
    # Spelled so that no static check sees it; the worker's snapshot covers the harness's data too.
    forward = (
        "import sys\n"
        "sys.modules['kb_mcp.harness.worker.' + 'values'].DEFAULT_TOLERANCES['float32'] = (1.0, 1.0)"
    )
    restarts = pool.census_restarts
    reply = pool.census(relu_problem, _candidate(forward))
    assert not reply.clean
    messages = [f.message for f in reply.findings if f.code == FindingCode.harness_tampering]
    assert any("kb_mcp.harness.worker.values.DEFAULT_TOLERANCES" in m for m in messages), reply.findings
    assert pool.census_restarts == restarts + 1
    assert pool.census(relu_problem, _candidate()).clean


def test_the_worker_reads_the_answers_of_its_own_request() -> None:
    pool_end, worker_end = socket.socketpair()
    try:
        channel = Channel(worker_end)
        channel.begin("r1", b"k" * 32)
        reply = CensusReply(census={"available": True, "own": ["k"]}, pid=7)
        send(pool_end, CensusAnswer(rid="r1", reply=reply), POOL_KEY)
        assert channel.ask_census() == reply
        send(pool_end, CensusAnswer(rid="another", reply=reply), POOL_KEY)
        with pytest.raises(RuntimeError, match="census"):
            channel.ask_census()
        send(pool_end, BuildAnswer(rid="r1", reply=BuildReply(ok=True)), POOL_KEY)
        with pytest.raises(RuntimeError, match="'build_answer'"):
            channel.ask_census()
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
        assert not spare.starting() and spare.alive() and spare.info and spare.info.role == "verify"
        assert spare.info.pid != p.info().pid
