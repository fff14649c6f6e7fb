"""The work census's way through the harness (`profiling.work`, the census ask), on CPU."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from kb_mcp.harness.plausibility import KernelWork, WorkCensus
from kb_mcp.harness.problem import load_problem
from kb_mcp.harness.protocol import FROM_WORKER, CensusAnswer, CensusAsk, CensusReply
from kb_mcp.harness.sandbox.channel import POOL_KEY, FrameReader, send
from kb_mcp.harness.sandbox.sandbox import detect
from kb_mcp.harness.worker.main import Channel
from kb_mcp.profiling.work import take_work_census

ROOT = Path(__file__).resolve().parents[2]


def test_the_worker_asks_for_the_work_census_and_reads_it_typed() -> None:
    pool_end, worker_end = socket.socketpair()
    key = b"k" * 32
    try:
        channel = Channel(worker_end)
        channel.begin("r1", key)
        census = WorkCensus(available=True, kernels=[KernelWork(name="colsum", dram_read_bytes=67e6,
                                                                dram_write_bytes=0.0, warp_instructions=1e6)])
        send(pool_end, CensusAnswer(rid="r1", reply=CensusReply(work=census)), POOL_KEY)
        reply = channel.ask_census(counters=True)
        ask = FrameReader(pool_end).read_message(FROM_WORKER, key, time.monotonic() + 5)
        assert isinstance(ask, CensusAsk) and ask.counters and ask.rid == "r1"
        assert reply.work == census and reply.work.dram_bytes == 67e6
    finally:
        pool_end.close()
        worker_end.close()


def test_without_ncu_the_census_is_unavailable_and_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KB_MCP_NCU", "")  # `profiler.find_ncu`: an empty value means "no ncu"
    problem = load_problem(ROOT / "examples" / "problems" / "linear_sum.py")
    source = (ROOT / "examples" / "candidates" / "linear_sum_rewrite_nvrtc.py").read_text()
    census = take_work_census(problem, source, cache_dir=tmp_path, sandbox=detect())
    assert not census.available and census.kernels == []
    assert "ncu" in census.note and "KB_MCP_NCU" in census.note
