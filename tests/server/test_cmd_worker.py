"""`kb-mcp worker ADDRESS` serving a running Dask scheduler, and `kb-mcp eval --cluster ADDRESS` using it:
every process real (the scheduler, the workers, the eval), the workers sharing no folder with the eval
(each its own KB_MCP_HOME and cache), compile-only checks with real nvcc."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client

from kb_mcp.campaign.store import CampaignStore
from kb_mcp.kb.store import KBStore

TREE = Path(__file__).resolve().parents[1] / "campaign" / "kernelbench_tree"
CLI = [sys.executable, "-m", "kb_mcp.server.cli"]


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "KB_MCP_HOME": str(home), "KB_MCP_CACHE": str(home / "cache"), "PYTHONUNBUFFERED": "1"}
    env.pop("KB_MCP_KB", None)
    return env


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[str]:
    """A Dask scheduler on loopback, its address."""
    info = tmp_path / "scheduler.json"
    proc = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                             "--port", "0", "--no-dashboard", "--scheduler-file", str(info)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        yield json.loads(info.read_text())["address"]
    finally:
        _stop(proc)


@pytest.mark.nvcc
@pytest.mark.slow
def test_an_eval_uses_the_workers_of_a_running_scheduler(tmp_path: Path, scheduler: str) -> None:
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen([*CLI, "worker", scheduler, "--cpu-workers", "2"], env=_env(tmp_path / "host-b"),
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        with Client(scheduler, timeout=60) as client:  # both workers up: the eval then sees two slots
            client.wait_for_workers(2, timeout=120)
        out = tmp_path / "out"
        proc = subprocess.run([*CLI, "--kb", str(tmp_path / "kb.json"), "eval", str(TREE), "--solutions",
                               str(TREE / "solutions"), "--compile-only", "--out", str(out), "--no-progress",
                               "--cluster", scheduler],
                              env=_env(tmp_path / "host-a"), capture_output=True, text=True, timeout=240)
    finally:
        _stop(worker)
        log.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"verifying on the Dask cluster at {scheduler}: 2 at once" in proc.stdout + proc.stderr
    host = socket.gethostname()
    # each line says which worker verified it: two at once, so both did
    assert f"[{host}-cpu-0 on " in proc.stderr and f"[{host}-cpu-1 on " in proc.stderr
    store = CampaignStore(out)
    initials = store.initials()
    assert {k: v.verdict.value for k, v in initials.items()} == {
        "1_Scale": "needs_gpu", "2_Add_Bias": "needs_gpu", "1_Scale_Add_ReLU": "compile_error"}
    with KBStore.open(tmp_path / "kb.json").read() as view:  # the coordinator stored every verdict
        assert all(len(view.candidate_verdicts(r.candidate_id)) == 1 for r in initials.values())
    # the workers' host wrote no KB of its own: it only verified
    assert not (tmp_path / "host-b" / "kb.json").exists()
    assert "2 worker(s) for" in (tmp_path / "worker.log").read_text()


def test_a_host_without_gpu_serves_only_cpu_workers_when_asked(tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "worker", "tcp://127.0.0.1:1"], env={**_env(tmp_path), "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3  # the machine's: it has no GPU to serve
    assert "shows none; add --cpu-workers N to compile on CPU workers" in proc.stderr
    assert "--compile-only" not in proc.stderr  # eval's flag: the worker has none
    bad = subprocess.run([*CLI, "worker", "tcp://127.0.0.1:1", "--cpu-workers", "0"], env=_env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--cpu-workers takes 1 or more" in bad.stderr
