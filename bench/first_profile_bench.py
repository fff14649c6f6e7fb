"""The first profile_kernel of a fresh `kb-mcp serve`, with and without the driver it warms at start.

    source .whl/prelude.sh && python3 bench/first_profile_bench.py [--out DIR] [--repeat 3] [--pairs 1]

For each (problem, candidate) pair, `repeat` times, each condition on a new server over stdio driven
by a real MCP client (as an agent's), the conditions interleaved:

  cold      KB_MCP_PROFILE_STANDBY=0: the first profile starts its own driver (a server before the
            warm-up, or `kb-mcp call`)
  at once   the default: profile_kernel called right after the handshake, while the warmed driver is
            still starting (the request hands it the spec and waits only for the rest of its start-up)
  ready     the default: profile_kernel called once the server logs its driver ready (an agent that
            reads the problem and writes a candidate first)

and prints the medians side by side: the tool call's wall time as the client sees it, the server's
own `wall_s`, how long after the spawn the driver was ready, and whether the profile ran on the
waiting driver (its stored phases include `standby_wait`). Target: <= 8 s for a first profile.
Writes first_profile_bench.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
PAIRS = [
    ("examples/problems/swish.py", "examples/candidates/swish_nvrtc.py"),
    ("tests/profiling/problems/relu_mul_add.py", "tests/profiling/problems/relu_mul_add_fused.py"),
]
CONDITIONS = ("cold", "at once", "ready")
READY_LINE = "profiling driver ready"  # what kb_mcp.server.prewarm logs
READY_LIMIT_S = 120.0


async def first_profile(kb: Path, env: dict[str, str], arguments: dict[str, Any], wait_ready: bool,
                        log_path: Path) -> dict[str, Any]:
    """Spawns a server, optionally waits for its warmed driver, calls profile_kernel once."""
    from mcp import Client
    from mcp.client.stdio import stdio_client

    from kb_mcp.clients.mcp_client import call_json, stdio_params
    from kb_mcp.profiling.profile_store import ProfileStore
    from kb_mcp.tools.context import ToolContext

    row: dict[str, Any] = {}
    with log_path.open("w") as errlog:
        spawned = time.perf_counter()
        async with Client(stdio_client(stdio_params(kb, env=env), errlog=errlog)) as client:
            row["handshake_s"] = time.perf_counter() - spawned
            if wait_ready:
                deadline = time.monotonic() + READY_LIMIT_S
                while READY_LINE not in log_path.read_text():
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"no warmed driver within {READY_LIMIT_S} s: see {log_path}")
                    await anyio.sleep(0.1)
                row["ready_after_spawn_s"] = time.perf_counter() - spawned
            start = time.perf_counter()
            result = await call_json(client, "profile_kernel", arguments)
            row["call_s"] = time.perf_counter() - start
    if result.get("status") != "profiled":
        raise RuntimeError(f"not profiled: {result.get('summary')}")
    row["server_wall_s"] = result["wall_s"]
    phases = ProfileStore(ToolContext(kb, standby_profiler=False).profiles_dir).load(result["profile_id"]).phases_s
    row["on_waiting_driver"] = "standby_wait" in phases
    row["phases_s"] = phases
    return row


async def bench_pair(problem: str, candidate: str, repeat: int, work: Path) -> dict[str, Any]:
    """Every condition `repeat` times on this pair (one discarded cold run first pays one-time costs)."""
    kb = work / "kb.json"
    base = {**os.environ, "KB_MCP_CACHE": str(work / "cache"), "PYTHONUNBUFFERED": "1"}
    base.pop("KB_MCP_PROFILE_STANDBY", None)
    envs = {"cold": {**base, "KB_MCP_PROFILE_STANDBY": "0"}, "at once": base, "ready": base}
    arguments = {"problem": str(ROOT / problem), "candidate": str(ROOT / candidate)}
    await first_profile(kb, envs["cold"], arguments, False, work / "serve-0.log")
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONDITIONS}
    for i in range(repeat):
        for condition in CONDITIONS:
            log_path = work / f"serve-{i}-{condition.replace(' ', '-')}.log"
            row = await first_profile(kb, envs[condition], arguments, condition == "ready", log_path)
            runs[condition].append(row)
            print(json.dumps({"pair": Path(candidate).stem, "condition": condition, **row}, default=float), flush=True)
            await anyio.sleep(2.0)  # the stopped server's processes are gone before the next starts
    summary: dict[str, Any] = {"pair": f"{Path(problem).stem} + {Path(candidate).stem}"}
    for condition, rows in runs.items():
        summary[condition] = {
            "call_s": statistics.median(r["call_s"] for r in rows),
            "server_wall_s": statistics.median(r["server_wall_s"] for r in rows),
            "on_waiting_driver": sum(r["on_waiting_driver"] for r in rows),
            "runs": len(rows),
        }
        ready = [r["ready_after_spawn_s"] for r in rows if "ready_after_spawn_s" in r]
        if ready:
            summary[condition]["ready_after_spawn_s"] = statistics.median(ready)
    return summary


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'pair':44s} " + " ".join(f"{c + ' (warm n)':>18s}" for c in CONDITIONS) + f" {'ready after':>11s}"]
    for r in rows:
        cells = " ".join(f"{r[c]['call_s']:10.2f} s ({r[c]['on_waiting_driver']}/{r[c]['runs']})" for c in CONDITIONS)
        lines.append(f"{r['pair']:44s} {cells} {r['ready'].get('ready_after_spawn_s', 0.0):9.1f} s")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    """Benches the chosen pairs and writes the JSON."""
    rows = []
    for problem, candidate in PAIRS[: args.pairs]:
        if not (ROOT / problem).is_file() or not (ROOT / candidate).is_file():
            print(f"skip {problem} {candidate}: not in this checkout")
            continue
        work = Path(tempfile.mkdtemp(prefix="kbmcp-first-"))
        rows.append(await bench_pair(problem, candidate, args.repeat, work))
    print("\nfirst profile_kernel of a fresh server, client-side wall s (median; runs on the waiting driver / runs)")
    print(_table(rows))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "first_profile_bench.json").write_text(json.dumps(rows, indent=1, default=float))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "out"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=1, help="bench only the first N pairs")
    args = parser.parse_args()
    from kb_mcp.profiling.profiler import find_ncu

    if find_ncu() is None:
        print("no ncu on this machine: nothing to compare", file=sys.stderr)
        return 1
    return anyio.run(run, args)


if __name__ == "__main__":
    sys.exit(main())
