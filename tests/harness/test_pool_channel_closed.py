"""A harness worker gone between being found ready and taking a request (killed while idle): the
send's broken pipe is the harness's WorkerError, never an OSError escaping to the caller, and the
pool has replaced the worker, so the next request is served (real sandboxed worker processes)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from kb_mcp.harness.pool.pool import WorkerError, WorkerPool
from kb_mcp.harness.protocol import PingRequest
from kb_mcp.harness.sandbox.channel import new_key
from kb_mcp.harness.sandbox.sandbox import detect


def test_a_request_to_a_worker_killed_while_idle_is_a_worker_error_and_the_pool_goes_on(tmp_path: Path) -> None:
    with WorkerPool(cache_dir=tmp_path / "cache", sandbox=detect(), spare=False) as pool:
        pool.info()
        w = pool._worker
        assert w is not None
        os.kill(w.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while w.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not w.alive()
        with pytest.raises(WorkerError, match="channel closed before it took the request"):
            pool._send(w, PingRequest(rid="r", key=new_key().hex()))  # the send a verification makes
        assert pool._worker is not w and pool.restarts == 1  # replaced already
        assert pool.state()["verify"].info is not None  # the next request is served
