"""What the MCP layer costs: one cheap KB tool call made four ways, and a stdio server's start-up.

    python bench/bench_server.py [--calls 50]

Prints, side by side, the median latency of `suggest_optimizations` called
  direct     - the tool function itself (no MCP),
  in-memory  - through the server with the SDK's in-memory client (what `kb-mcp call` does),
  stdio      - through a spawned `kb-mcp serve` (what a local agent does),
  http       - through a spawned `kb-mcp serve --http` with a bearer token (a team server),
each as a ratio to the direct call, and the time from spawning `kb-mcp serve` to its first
tools/list answer. Runs on CPU; the KB is a fresh seeded file in a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from mcp import Client

from kb_mcp.clients.mcp_client import call_json, connect_http, serve_command, stdio_params
from kb_mcp.server.app import build_server
from kb_mcp.tools import suggest_optimizations
from kb_mcp.tools.context import ToolContext

ARGS = {"state_id": "memory_bandwidth_saturated", "k": 3, "temperature": 0.3}
TOKEN = "bench-token-0123456789abcdef"


async def _median_ms(call: Callable[[], Awaitable[object]], n: int) -> float:
    await call()  # warm: first call opens the KB, imports lazily
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def _bench(kb: Path, n: int) -> dict[str, float]:
    ctx = ToolContext(kb)
    req = suggest_optimizations.Request(**ARGS)

    async def direct() -> object:
        return suggest_optimizations.run(ctx, req)

    results = {"direct": await _median_ms(direct, n)}
    server = build_server(ToolContext(kb))
    async with Client(server) as client:
        results["in-memory"] = await _median_ms(lambda: call_json(client, "suggest_optimizations", ARGS), n)
    async with Client(stdio_params(kb, extra_args=["--log-level", "WARNING"])) as client:
        results["stdio"] = await _median_ms(lambda: call_json(client, "suggest_optimizations", ARGS), n)
    proc = subprocess.Popen(
        serve_command(kb, ["--http", "127.0.0.1:0"]),
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env={**os.environ, "KB_MCP_TOKEN": TOKEN},
    )
    try:
        assert proc.stderr is not None
        url = ""
        for line in proc.stderr:
            if line.startswith("serving http "):
                url = line.split()[2]
                break
        async with connect_http(url, TOKEN) as client:
            results["http"] = await _median_ms(lambda: call_json(client, "suggest_optimizations", ARGS), n)
    finally:
        proc.terminate()
        proc.wait(15)
    return results


async def _startup_s(kb: Path, n: int = 5) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        async with Client(stdio_params(kb, extra_args=["--log-level", "WARNING"])) as client:
            await client.list_tools()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kb = Path(tmp) / "kb.json"
        os.environ["KB_MCP_HOME"] = tmp
        results = anyio.run(_bench, kb, args.calls)
        startup = anyio.run(_startup_s, kb)
    base = results["direct"]
    print(f"suggest_optimizations, median of {args.calls} calls (python {sys.version.split()[0]}):")
    for name, ms in results.items():
        print(f"  {name:10s} {ms:8.2f} ms   x{ms / base:6.1f} vs direct")
    print(f"stdio server start to first tools/list: {startup:.2f} s (median of 5)")


if __name__ == "__main__":
    main()
