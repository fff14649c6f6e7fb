"""The GPU lane inside one server: a campaign job and a client's verifications in one real `kb-mcp
serve` process take turns, never overlapping (between servers: tests/server/test_two_servers_lane.py).

The server logs each hold of the lane with a monotonic timestamp. The campaign's holds run in its
job and rollout threads (`kb-mcp-job_*`, `kb-mcp-rollout_*`), the client's in the server's request
worker threads. On a GPU (`gpu` test) the campaign profiles and times for real beside a client that
times its own candidate; on CPU (`nvcc`) both verify compile-only, with real nvcc builds, and
neither takes the lane (nothing of a compile-only verification runs on a GPU).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import anyio
import pytest
from campaign_helpers import ROOT, SWISH
from fakellm import FakeLLMServer
from fakellm.campaign_script import campaign_script

from kb_mcp.campaign.store import CampaignStore
from kb_mcp.clients.mcp_client import call_json, connect_http, serve_command
from kb_mcp.harness.gpu.lane import LaneSpan, overlapping, read_spans

pytestmark = [pytest.mark.slow]

CANDIDATE = (ROOT / "examples" / "candidates" / "swish_nvrtc.py").read_text()
READY = re.compile(r"serving http (http://\S+/mcp) ")


def _start_server(kb: Path, env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        # the client and the campaign name the problem by its path: an HTTP server reads only the folders given
        serve_command(kb, ["--http", "127.0.0.1:0", "--files", str(SWISH.parent), "--log-level", "INFO"]),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env, cwd=ROOT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        found = READY.search(log.read_text(errors="replace"))
        if found:
            return proc, found.group(1)
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"server did not start:\n{log.read_text(errors='replace')}")


async def _campaign_beside_client(url: str, arguments: dict[str, object], options: dict[str,
                                                                                        object]) -> tuple[dict, int]:
    """Starts the campaign job, verifies candidates as a client until it ends; returns its status
    and how many verifications the client made."""
    async with connect_http(url) as client:
        job = await call_json(client, "start_job", {"kind": "run_campaign", "arguments": arguments})
        calls = 0
        status = job
        deadline = time.monotonic() + 500
        while status["status"] in ("queued", "running") and time.monotonic() < deadline:
            # a new source each time: a real nvcc build, not a cache hit
            source = CANDIDATE.replace('KERNEL = r"""\n', f'KERNEL = r"""\n// client build {calls}\n', 1)
            result = await call_json(client, "compile_and_verify", {
                "problem": str(SWISH), "candidate": source, "options": options,
            })
            assert result["record"]["verdict"] in ("needs_gpu", "faster", "slower"), result
            calls += 1
            status = await call_json(client, "job_status", {"job_id": job["job_id"], "job_key": job["job_key"]})
        status = await call_json(client, "job_status", {"job_id": job["job_id"], "job_key": job["job_key"],
                                                        "wait_s": 60})
    return status, calls


def _run(tmp_path: Path, compile_only: bool) -> tuple[dict, int, list[LaneSpan]]:
    """A campaign job beside a verifying client in one server; the job's status, the client's
    verifications, and the lane's holds from the server's log."""
    kb, log = tmp_path / "kb.json", tmp_path / "server.log"
    with FakeLLMServer(campaign_script()) as llm:
        env = {
            **os.environ,
            "KB_MCP_LLM_BASE_URL": llm.base_url, "KB_MCP_LLM_MODEL": "fake-model", "KB_MCP_LLM_API_KEY": "k",
            "KB_MCP_CACHE": str(tmp_path / "cache"),  # cold builds: each hold of the lane is real work
            "PYTHONUNBUFFERED": "1",
        }
        proc, url = _start_server(kb, env, log)
        try:
            arguments = {"problems": [str(SWISH)], "name": "lane", "compile_only": compile_only,
                         "iterations": 1, "steps": 2, "gradient_every": 0}
            status, client_calls = anyio.run(_campaign_beside_client, url, arguments, {"compile_only": compile_only})
        finally:
            proc.terminate()
            proc.wait(30)
    holds = read_spans(log.read_text(errors="replace"))
    # One holder at a time: no two holds intersect.
    assert overlapping(holds) == [], overlapping(holds)
    return status, client_calls, holds


def _campaign_verifications(tmp_path: Path) -> int:
    store = CampaignStore(tmp_path / "kb.artifacts" / "campaigns" / "lane")
    return sum(len(u.attempts) for u in [*store.initials().values(), *store.steps()])


@pytest.mark.nvcc
def test_campaign_job_and_client_verify_compile_only_without_the_lane(tmp_path: Path) -> None:
    status, client_calls, holds = _run(tmp_path, compile_only=True)
    assert status["status"] == "succeeded", status
    assert _campaign_verifications(tmp_path) >= 3 and client_calls >= 1
    assert holds == []  # their builds ran beside each other, none in line for the GPU


@pytest.mark.gpu
def test_campaign_profiles_and_timings_take_turns_with_a_client_on_the_gpu(tmp_path: Path) -> None:
    status, client_calls, holds = _run(tmp_path, compile_only=False)
    assert status["status"] == "succeeded", status
    campaign = [a for a in holds if a.thread.startswith("kb-mcp-")]
    client = [a for a in holds if not a.thread.startswith("kb-mcp-")]
    # the campaign's timings and its profiles both held the lane, and so did every client timing
    assert sum(a.what == "verify swish" for a in campaign) == _campaign_verifications(tmp_path)
    assert any(a.what == "profile_kernel" for a in campaign)
    assert sum(a.what == "verify swish" for a in client) == client_calls >= 1
    assert {a.what for a in client} <= {"verify swish", "start the harness worker"}
    assert any(a.waited_s > 0 for a in holds)
