"""A server warms a profiling driver as it starts, where there is a GPU: without one it starts none
(checked in the server's own ToolContext and standby pool), with standby off it starts none, and on
a GPU the first profile_kernel of a fresh `kb-mcp serve` runs on the warmed driver."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import stdio_client

from kb_mcp.clients.mcp_client import call_json, stdio_params
from kb_mcp.profiling.profile_store import ProfileStore
from kb_mcp.server.app import build_server
from kb_mcp.server.gpu import detect_gpus
from kb_mcp.tools.context import ToolContext

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples" / "problems" / "swish.py"
CANDIDATE = ROOT / "examples" / "candidates" / "swish_nvrtc.py"
READY_LINE = "profiling driver ready"
READY_LIMIT_S = 30.0


@pytest.mark.parametrize("where", ["hidden", "none"])
async def test_without_a_gpu_the_server_warms_no_driver(
        where: str, kb_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    if where == "hidden":
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # any machine: the GPUs are hidden from CUDA
    elif detect_gpus():
        pytest.skip("checks a machine without a GPU; this one has one")
    caplog.set_level(logging.INFO, logger="kb_mcp.server.prewarm")
    ctx = ToolContext(kb_path, cache_dir=tmp_path / "cache")
    server = build_server(ctx)
    try:
        async with Client(server) as client:
            await client.list_tools()
            warmup = server.profiler_warmup
            assert warmup is not None  # standby is on: the server looked for a GPU
            warmup.join(30)
            assert not warmup.is_alive()
            assert "profilers" not in ctx.__dict__  # no standby pool, so no driver
            assert not (tmp_path / "cache" / "profile-standby").exists()
        assert "no GPU found" in caplog.text and "warming" not in caplog.text
    finally:
        server.jobs.shutdown()
        ctx.close()


async def test_with_standby_off_the_server_warms_nothing(kb_path: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    one_shot = ToolContext(kb_path, cache_dir=tmp_path / "cache", standby_profiler=False)  # as `kb-mcp call`
    monkeypatch.setenv("KB_MCP_PROFILE_STANDBY", "0")
    off = ToolContext(kb_path, cache_dir=tmp_path / "cache")
    for ctx in (one_shot, off):
        server = build_server(ctx)
        async with Client(server) as client:
            await client.list_tools()
            assert server.profiler_warmup is None
        server.jobs.shutdown()
        ctx.close()
    assert not (tmp_path / "cache" / "profile-standby").exists()


@pytest.mark.gpu
async def test_the_first_profile_of_a_fresh_server_is_warm(kb_path: Path, tmp_path: Path) -> None:
    """`kb-mcp serve` over stdio, a real client: once the server logs its driver ready, the first
    profile_kernel runs on it (its stored phases have the driver's wait)."""
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as errlog:
        started = time.perf_counter()
        async with Client(stdio_client(stdio_params(kb_path), errlog=errlog)) as client:
            await client.list_tools()
            deadline = time.monotonic() + READY_LIMIT_S
            while READY_LINE not in log_path.read_text():
                assert time.monotonic() < deadline, f"not ready within {READY_LIMIT_S} s:\n{log_path.read_text()}"
                await anyio.sleep(0.2)
            ready_s = time.perf_counter() - started
            start = time.perf_counter()
            result = await call_json(client, "profile_kernel", {"problem": str(PROBLEM), "candidate": str(CANDIDATE)})
            wall_s = time.perf_counter() - start
    assert result["status"] == "profiled" and result["counters_available"], result
    assert [k["name"] for k in result["kernels"]] == ["swish_kernel"]
    phases = ProfileStore(ToolContext(kb_path, standby_profiler=False).profiles_dir).load(result["profile_id"]).phases_s
    assert "standby_wait" in phases, phases  # the driver had started before the request: not a cold run
    print(f"first profile_kernel of a fresh server: {wall_s:.2f} s wall (tool {result['wall_s']} s), "
          f"driver ready {ready_s:.1f} s after the server was spawned; phases {phases}")
