"""Without a GPU the server still starts and serves the KB tools, and the GPU tools say clearly what
they could and could not do: the whole round through a real MCP client on a CPU-only machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from kb_mcp.clients.mcp_client import call_json
from kb_mcp.server.app import KbMcpServer, build_server
from kb_mcp.server.gpu import detect_gpus
from kb_mcp.tools.context import ToolContext

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples" / "problems" / "swish.py"
CANDIDATE = ROOT / "examples" / "candidates" / "swish_nvrtc.py"

pytestmark = pytest.mark.skipif(bool(detect_gpus()), reason="checks the no-GPU behaviour; this machine has a GPU")

# raw metrics of a kernel streaming DRAM at 92 % of peak with idle SMs
BANDWIDTH_BOUND = {
    "duration_ns": 5.1e6, "dram_throughput_pct": 92.0, "memory_throughput_pct": 93.0, "sm_throughput_pct": 18.0,
    "achieved_occupancy_pct": 85.0, "theoretical_occupancy_pct": 100.0, "sectors_per_request": 4.0,
    "l2_hit_rate_pct": 3.0, "threads_per_inst": 32.0,
}


@pytest.fixture
def server(kb_path: Path) -> KbMcpServer:
    srv = build_server(ToolContext(kb_path))
    yield srv
    srv.jobs.shutdown()
    srv.kb_ctx.close()


def test_the_server_says_it_has_no_gpu(server: KbMcpServer) -> None:
    assert "GPU: none found" in (server.instructions or "")
    assert "compile_and_verify" in (server.instructions or "")


@pytest.mark.nvcc
async def test_a_round_without_a_gpu(server: KbMcpServer) -> None:
    async with Client(server) as client:
        profiled = await call_json(client, "profile_kernel", {"problem": str(PROBLEM), "candidate": str(CANDIDATE)})
        assert profiled["status"] == "needs_gpu" and profiled["profile_id"] is None
        assert profiled["candidate_id"].startswith("c_") and "GPU" in profiled["summary"]
        classified = await call_json(client, "classify_state", {"metrics": BANDWIDTH_BOUND, "kernel_name": "swish"})
        state = classified["kernels"][0]["state_id"]
        assert state == "memory_bandwidth_saturated"
        opt = (await call_json(client, "suggest_optimizations", {"state_id": state, "k": 1}))["suggestions"][0]["id"]
        verified = await call_json(client, "compile_and_verify", {"problem": str(PROBLEM), "candidate": str(CANDIDATE)})
        assert verified["record"]["verdict"] == "needs_gpu" and verified["compile"]["ok"]
        assert "need a GPU" in verified["summary"] or "needs a GPU" in verified["summary"]
        recorded = await call_json(
            client, "record_outcome", {"state_id": state, "optimization_id": opt,
                                       "candidate_id": verified["record"]["candidate_id"]}
        )
    assert recorded["verdict"] == "needs_gpu" and recorded["score_moved"] is False
