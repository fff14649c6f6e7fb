"""A harness worker gone between being found ready and taking a request (killed while idle): the
send's broken pipe is the harness's WorkerError, never an OSError escaping to the caller, and the
pool has replaced the worker, so the next request is served (real sandboxed worker processes)."""

from __future__ import annotations

import os
import select
import signal
import socket
import time
from pathlib import Path

import pytest

from kb_mcp.harness.pool.pool import WorkerError, WorkerPool
from kb_mcp.harness.protocol import PingRequest
from kb_mcp.harness.sandbox.channel import new_key
from kb_mcp.harness.sandbox.sandbox import detect


def _closed(sock: socket.socket) -> bool:
    """Whether the other end of the channel has gone (a read would see its end)."""
    ready, _, _ = select.select([sock], [], [], 0)
    if not ready:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:  # reset by the dead peer: gone too
        return True


def test_a_request_to_a_worker_killed_while_idle_is_a_worker_error_and_the_pool_goes_on(tmp_path: Path) -> None:
    with WorkerPool(cache_dir=tmp_path / "cache", sandbox=detect(), spare=False) as pool:
        pool.info()
        w = pool._worker
        assert w is not None
        os.killpg(w.pid, signal.SIGKILL)  # the sandbox's process and the worker in it
        deadline = time.monotonic() + 30
        while (w.alive() or not _closed(w.sock)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the worker inside dies a moment after the sandbox's process: its end of the channel
        assert not w.alive() and _closed(w.sock)
        with pytest.raises(WorkerError, match="channel closed before it took the request"):
            pool._send(w, PingRequest(rid="r", key=new_key().hex()))  # the send a verification makes
        assert pool._worker is not w and pool.restarts == 1  # replaced already
        assert pool.state()["verify"].info is not None  # the next request is served
