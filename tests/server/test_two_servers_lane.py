"""Two `kb-mcp serve` processes on one KB and machine (two agents, each with its own server; or
`kb-mcp eval` beside a server) verifying at once never overlap on a GPU: the GPU lane is
machine-wide. Both servers' lane logs, on the machine-wide monotonic clock, prove it, and a client
that waits is told, through its progress, which server holds the GPU.

On a GPU (`gpu`) the servers check and time for real on the GPU's UUID. On CPU (`nvcc`) they verify
compile-only under an explicit GPU key (`KB_MCP_LANE_KEY`): real nvcc builds, which take no lane (no
GPU work), so neither server waits for the other.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import anyio
import pytest
from serverproc import HttpServer, http_server

from kb_mcp.clients.mcp_client import call_json, connect_http
from kb_mcp.harness.gpu import lane
from kb_mcp.harness.gpu.gpu_key import ENV_LANE_KEY
from kb_mcp.harness.gpu.lane_file import ENV_LANE_DIR

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples" / "problems" / "swish.py"
CANDIDATE = (ROOT / "examples" / "candidates" / "swish_nvrtc.py").read_text()
CALLS = 2  # per server

pytestmark = [pytest.mark.slow]


async def _client(url: str, tag: str, compile_only: bool, said: list[str], verdicts: list[str]) -> None:
    async def progress(done: float, total: float | None, message: str | None) -> None:
        said.append(message or "")

    async with connect_http(url) as client:
        for i in range(CALLS):
            # a new kernel text each time: a real build, never a cache hit
            source = CANDIDATE.replace('KERNEL = r"""\n', f'KERNEL = r"""\n// {tag} {i}\n', 1)
            result = await call_json(client, "compile_and_verify", {
                "problem": str(PROBLEM), "candidate": source, "options": {"compile_only": compile_only},
            }, progress=progress, timeout_s=600)
            verdicts.append(result["record"]["verdict"])


async def _verify_at_once(servers: list[HttpServer], compile_only: bool) -> tuple[list[list[str]], list[str]]:
    said: list[list[str]] = [[] for _ in servers]
    verdicts: list[str] = []
    run = uuid.uuid4().hex[:6]
    async with anyio.create_task_group() as tg:
        for i, server in enumerate(servers):
            tg.start_soon(_client, server.url, f"{run}-{i}", compile_only, said[i], verdicts)
    return said, verdicts


def _two_servers_verify(tmp_path: Path, env: dict[str, str], compile_only: bool
                        ) -> tuple[list[lane.LaneSpan], list[int], list[list[str]], list[str]]:
    kb = tmp_path / "kb.json"  # one KB: the shared-KB case
    env = {**env, "KB_MCP_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1",
           "KB_MCP_FILES": str(PROBLEM.parent)}  # the clients name the problem by its path on the server
    with http_server(kb, env=env) as first, http_server(kb, env=env) as second:
        said, verdicts = anyio.run(_verify_at_once, [first, second], compile_only)
        pids = [first.proc.pid, second.proc.pid]
    spans = lane.read_spans(first.stderr + second.stderr)
    return spans, pids, said, verdicts


def _check(spans: list[lane.LaneSpan], pids: list[int], said: list[list[str]], gpu: str) -> None:
    assert lane.overlapping(spans) == [], lane.overlapping(spans)
    assert all(s.machine and s.gpu == gpu for s in spans), spans
    verifications = [s for s in spans if s.what == "verify swish"]
    assert sorted(s.pid for s in verifications) == sorted(pids * CALLS)  # each call held the lane, once
    # each server also warms a profiling driver under the lane as it starts (tools/profile_kernel.py)
    assert {s.what for s in spans} <= {"verify swish", "start the harness worker", "profiling driver warm-up"}
    assert any(s.waited_s > 0.05 for s in verifications)  # and they did contend
    # A waiting client was told which server held the GPU (the other one: its pid).
    told = [(i, m) for i, messages in enumerate(said) for m in messages
            if re.match(rf"waiting for the GPU {gpu}: (verify swish|start the harness worker) \(`kb-mcp --kb ", m)]
    assert told, said
    assert all(re.search(rf"pid {pids[1 - i]}, .*since \d\d:\d\d:\d\d UTC", m) for i, m in told), told


@pytest.mark.nvcc
def test_two_servers_verifying_compile_only_never_wait_for_the_lane(tmp_path: Path) -> None:
    key = f"test-{uuid.uuid4().hex[:8]}"
    spans, _, said, verdicts = _two_servers_verify(
        tmp_path, {ENV_LANE_KEY: key, ENV_LANE_DIR: str(tmp_path / "lanes")}, compile_only=True)
    assert verdicts == ["needs_gpu"] * 2 * CALLS
    assert spans == [] and not any(m.startswith("waiting for the GPU") for messages in said for m in messages)


@pytest.mark.gpu
def test_two_servers_timing_at_once_never_share_the_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_LANE_KEY, raising=False)
    monkeypatch.delenv(ENV_LANE_DIR, raising=False)  # the machine's own lane folder
    spans, pids, said, verdicts = _two_servers_verify(tmp_path, {}, compile_only=False)
    assert set(verdicts) <= {"faster", "slower"} and len(verdicts) == 2 * CALLS, verdicts
    (gpu,) = {s.gpu for s in spans}
    assert gpu.startswith(("GPU-", "MIG-")), gpu
    _check(spans, pids, said, gpu)
