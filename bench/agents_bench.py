"""Many agents, one GPU: N real MCP clients on one server, each verifying its own stream of new
candidates, against one agent alone, in one run.

    python bench/agents_bench.py /path/to/kernelbench --agents 8 --per-agent 6 --out "$OUT"     # on a GPU
    python bench/agents_bench.py /path/to/kernelbench --agents 4 --per-agent 2 --compile-only   # on CPU
    python bench/agents_bench.py KB --transport stdio --solutions bench/eval_pipeline_solutions --problems 9,12

The set: the level-1 and level-2 solutions of `--solutions` (default bench/kernelbench_solutions, mostly
NVRTC, and bench/eval_pipeline_solutions, `load_inline` with cold builds of tens of seconds), each with
its problem from the KernelBench checkout at its real size (`levelN/<same file name>`); `--problems`
keeps those whose KernelBench id it names. Each agent verifies `--per-agent` candidates: the set in
turn from an offset of its own, each with a comment naming the run, the agent and the item put in its
CUDA source, so every candidate is new and its build cold.

The server: `--transport http` (the default) starts one `kb-mcp serve --http` and connects every agent
to it; `--transport stdio` has each agent spawn its own `kb-mcp serve` (what a local agent does), the
servers sharing one KB and, through the machine-wide GPU lane, the GPU. The runs, in this order:

1. warm-up (not measured): each problem the two runs use, once, with its solution untagged, the agents
   at once, so the workers are up, the compilers probed and (on a GPU) its baselines timed and cached,
   as on a server up a while (problems the runs do not use are not warmed: on a GPU each costs a first
   verdict of tens of seconds);
2. alone: one agent, its stream one verdict after another (`--alone` verdicts; default `--per-agent`);
3. together: N agents at once, each its own stream.

Printed per run: verdicts per minute, p50/p95 seconds per verdict, the lane wait (p50/p95 overall and
each agent's p95 against the median agent's), the lane held beyond each verdict's GPU phases (max),
the most any verdict spent under the lane on set-up (importing the problem, constructing the models:
partly host work the "beyond" figure counts as GPU work), and two busy shares: the lane held (the
verdicts' `lane.held_s` over wall) and the GPU busy (NVML's utilization sampled in this process,
`harness.gpu.gpu_busy`: kernels running); then together over alone.
With `--compile-only` (or no GPU) the verdicts are compile-only checks on the CPU and it says so.
Each verdict is logged as it comes (stderr); agents.json in --out is written after each run, so a run
stopped by a time limit keeps what it measured.

On a GPU, in one device call of ten minutes: `--solutions bench/eval_pipeline_solutions --agents 8
--per-agent 2 --alone 4` (ten level-2 problems, `load_inline` builds of tens of seconds each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOLUTIONS = [ROOT / "bench" / "kernelbench_solutions", ROOT / "bench" / "eval_pipeline_solutions"]
TOKEN = "agents-bench-" + uuid.uuid4().hex
CALL_TIMEOUT_S = 1800.0
_TAG_BEFORE = ("#include", 'extern "C"', "__global__")
SETUP_PHASES = ("static", "import", "construct")


class Item(BaseModel):
    """One candidate of the set: a solution and its problem."""

    model_config = ConfigDict(extra="forbid")

    name: str
    problem: Path
    solution: Path


class Verdict(BaseModel):
    """One verdict as its agent saw it."""

    model_config = ConfigDict(extra="forbid")

    agent: int
    problem: str
    verdict: str
    seconds: float = Field(description="the call, as the client timed it")
    start_s: float = Field(description="since the run's clock started")
    elapsed_s: float = Field(0.0, description="the verification, as the server timed it")
    waited_s: float = 0.0
    held_s: float = 0.0
    beyond_s: float = Field(0.0, description="the lane held beyond the phases run under it")
    phases_s: dict[str, float] = Field(default_factory=dict)
    error: str = ""

    @property
    def setup_s(self) -> float:
        """The set-up steps run under the lane (`SETUP_PHASES`): the worker's, partly host-side work
        (importing the problem, constructing both models with their weights), which the lane's "beyond
        its phases" counts as GPU work."""
        return sum(self.phases_s.get(p, 0.0) for p in SETUP_PHASES)


class Run(BaseModel):
    """One run of the bench: its agents' verdicts and what the GPU did meanwhile."""

    model_config = ConfigDict(extra="forbid")

    name: str
    agents: int
    wall_s: float
    verdicts: list[Verdict]
    gpu_busy: float | None = None

    @property
    def per_minute(self) -> float:
        """Verdicts per minute of wall time."""
        return 60.0 * len(self.verdicts) / self.wall_s if self.wall_s else 0.0

    def figures(self) -> dict[str, Any]:
        """The run's headline figures."""
        secs = [v.seconds for v in self.verdicts]
        waits = [v.waited_s for v in self.verdicts]
        by_agent = {a: _pct([v.waited_s for v in self.verdicts if v.agent == a], 95) for a in range(self.agents)}
        median_agent = statistics.median(by_agent.values()) if by_agent else 0.0
        return {
            "agents": self.agents, "verdicts": len(self.verdicts), "wall_s": round(self.wall_s, 2),
            "per_minute": round(self.per_minute, 2), "p50_s": _pct(secs, 50), "p95_s": _pct(secs, 95),
            "wait_p50_s": _pct(waits, 50), "wait_p95_s": _pct(waits, 95),
            "agent_wait_p95_s": {str(a): w for a, w in by_agent.items()},
            "worst_agent_wait_p95_over_median": (round(max(by_agent.values()) / median_agent, 2) if median_agent
                                                 else None),
            "beyond_gpu_phases_max_s": round(max((v.beyond_s for v in self.verdicts), default=0.0), 3),
            "setup_under_lane_max_s": round(max((v.setup_s for v in self.verdicts), default=0.0), 3),
            "lane_share": round(sum(v.held_s for v in self.verdicts) / self.wall_s, 3) if self.wall_s else 0.0,
            "gpu_busy": self.gpu_busy,
            "errors": sum(bool(v.error) for v in self.verdicts),
            "verdict_counts": _counts(v.verdict for v in self.verdicts),
        }


def _pct(values: list[float], p: int) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))], 3)


def _counts(names: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in names:
        out[n] = out.get(n, 0) + 1
    return out


# -- the set ----------------------------------------------------------------------------------------

def the_set(kernelbench: Path, solutions: list[Path], ids: set[int] | None) -> list[Item]:
    """The level-1 and level-2 solutions with a problem in the checkout, in name order per folder."""
    items = []
    for folder in solutions:
        for level in ("level1", "level2"):
            for path in sorted((folder / level).glob("*.py")):
                problem = kernelbench / level / path.name
                number = int(path.name.split("_")[0]) if path.name.split("_")[0].isdigit() else -1
                if problem.is_file() and (ids is None or number in ids):
                    items.append(Item(name=f"{level}/{path.stem}", problem=problem, solution=path))
    return items


def tagged(source: str, tag: str) -> str:
    """The candidate with a comment naming `tag` put in its first CUDA source: a new candidate, its
    build cold (the source is hashed into the build's name)."""
    found = [i for i in (source.find(m) for m in _TAG_BEFORE) if i >= 0]
    if not found:
        return source + f"\n# {tag}\n"  # no CUDA source to mark: a new candidate all the same
    at = min(found)
    return source[:at] + f"// {tag}\n" + source[at:]


def streams(items: list[Item], agents: int, per_agent: int, run: str) -> list[list[tuple[Item, str]]]:
    """Each agent's stream: the set in turn from an offset of its own, each candidate tagged anew."""
    out = []
    for a in range(agents):
        stream = []
        for k in range(per_agent):
            item = items[(a * max(1, len(items) // max(1, agents)) + k) % len(items)]
            stream.append((item, tagged(item.solution.read_text(), f"agents bench {run} agent {a} item {k}")))
        out.append(stream)
    return out


def used(*runs: list[list[tuple[Item, str]]]) -> list[Item]:
    """Each item the runs' streams verify, once, in the order first met."""
    seen: dict[str, Item] = {}
    for run in runs:
        for stream in run:
            for item, _ in stream:
                seen.setdefault(item.name, item)
    return list(seen.values())


def warm_up_streams(items: list[Item], agents: int) -> list[list[tuple[Item, str]]]:
    """The warm-up: each item once, untagged, dealt round the agents (at most one agent per item)."""
    n = max(1, min(agents, len(items)))
    return [[(i, i.solution.read_text()) for i in items[a::n]] for a in range(n)]


# -- the server and its clients ---------------------------------------------------------------------

class HttpServer:
    """One `kb-mcp serve --http` on the KB, reading the problems of `files` (the KernelBench checkout)
    for its clients; its stderr (the lane's log among it) kept in a file."""

    def __init__(self, kb: Path, log: Path, files: Path) -> None:
        from kb_mcp.clients.mcp_client import serve_command

        # the agents name problems by their path in the checkout: an HTTP server reads only the folders given
        args = ["--http", "127.0.0.1:0", "--files", str(files), "--log-level", "INFO"]
        self.proc = subprocess.Popen(serve_command(kb, args),
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "KB_MCP_TOKEN": TOKEN})
        assert self.proc.stderr is not None
        self.url = ""
        self._log = log.open("w")
        for line in self.proc.stderr:
            self._log.write(line)
            if line.startswith("serving http "):
                self.url = line.split()[2]
                break
        if not self.url:
            raise RuntimeError(f"the server did not start: see {log}")
        # drained for the server's life, or a full pipe would stop it
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._log.write(line)
        self._log.close()

    def close(self) -> None:
        """Stops the server."""
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def connector(transport: str, kb: Path, server: HttpServer | None) -> Callable[[], AbstractAsyncContextManager[Any]]:
    """How an agent connects: to the one HTTP server, or through a stdio server of its own."""
    from mcp import Client

    from kb_mcp.clients.mcp_client import connect_http, stdio_params

    if transport == "http":
        assert server is not None
        return lambda: connect_http(server.url, TOKEN, timeout_s=CALL_TIMEOUT_S)

    @asynccontextmanager
    async def stdio() -> AsyncIterator[Any]:
        async with Client(stdio_params(kb, extra_args=["--log-level", "WARNING"])) as client:
            yield client

    return stdio


async def agent(n: int, connect: Callable[[], AbstractAsyncContextManager[Any]], stream: list[tuple[Item, str]],
                options: dict[str, Any], t0: float, out: list[Verdict]) -> None:
    """One agent: connects, then verifies its stream one candidate after another."""
    from kb_mcp.clients.mcp_client import ToolCallError, call_json

    async with connect() as client:
        await client.list_tools()
        for item, source in stream:
            start = time.monotonic()
            args = {"problem": str(item.problem), "candidate": source, "options": options}
            try:
                r = await call_json(client, "compile_and_verify", args, timeout_s=CALL_TIMEOUT_S)
            except ToolCallError as exc:
                out.append(Verdict(agent=n, problem=item.name, verdict="error", seconds=time.monotonic() - start,
                                   start_s=round(start - t0, 3), error=str(exc)[:300]))
                _say(f"  agent {n}: {item.name} error: {str(exc)[:200]}")
                continue
            v = _verdict(n, item, r, time.monotonic() - start, start - t0)
            out.append(v)
            _say(f"  agent {n}: {item.name} {v.verdict} in {v.seconds:.1f} s (lane waited {v.waited_s:.1f} s, "
                 f"held {v.held_s:.1f} s, beyond its GPU phases {v.beyond_s:.2f} s)")


def _verdict(n: int, item: Item, r: dict[str, Any], seconds: float, start_s: float) -> Verdict:
    from kb_mcp.harness.gpu.lane_use import LaneUse

    lane = LaneUse.model_validate(r["lane"]) if r.get("lane") else LaneUse()
    phases = r.get("phases_s") or {}
    return Verdict(agent=n, problem=item.name, verdict=r["record"]["verdict"], seconds=round(seconds, 3),
                   start_s=round(start_s, 3), elapsed_s=r.get("elapsed_s") or 0.0, waited_s=lane.waited_s,
                   held_s=lane.held_s,
                   beyond_s=lane.beyond_gpu_phases(phases) if lane.holds else 0.0, phases_s=phases)


def run_agents(name: str, connect: Callable[[], AbstractAsyncContextManager[Any]],
               agent_streams: list[list[tuple[Item, str]]], options: dict[str, Any]) -> Run:
    """The agents at once, each its stream; the GPU's utilization sampled meanwhile."""
    from kb_mcp.harness.gpu.gpu_busy import GpuBusy

    verdicts: list[Verdict] = []

    async def all_agents() -> None:
        async with anyio.create_task_group() as tg:
            for n, stream in enumerate(agent_streams):
                tg.start_soon(agent, n, connect, stream, options, t0, verdicts)

    with GpuBusy() as busy:
        t0 = time.monotonic()
        anyio.run(all_agents)
        wall = time.monotonic() - t0
    return Run(name=name, agents=len(agent_streams), wall_s=round(wall, 3), verdicts=verdicts,
               gpu_busy=busy.share(1))


# -- the reading ------------------------------------------------------------------------------------

def summary(alone: Run, together: Run, compile_only: bool) -> dict[str, Any]:
    """Both runs' figures and together over alone."""
    ratio = together.per_minute / alone.per_minute if alone.per_minute else None
    alone_each = alone.wall_s / len(alone.verdicts) if alone.verdicts else 0.0
    return {"compile_only": compile_only, "alone": alone.figures(), "together": together.figures(),
            "throughput_ratio": round(ratio, 3) if ratio else None,
            # all of together's verdicts one after another would take alone's time per verdict each
            "wall_over_serial": (round(together.wall_s / (len(together.verdicts) * alone_each), 3)
                                 if alone_each and together.verdicts else None)}


def report(s: dict[str, Any]) -> str:
    """The text the bench prints."""
    lines = ["compile-only checks on the CPU (no GPU: the path's and the compilers' figures, not a GPU's)"
             if s["compile_only"] else "GPU verifications"]
    for name in ("alone", "together"):
        f = s[name]
        busy = "-" if f["gpu_busy"] is None else f"{f['gpu_busy']:.0%}"
        lines.append(f"{name:<9} {f['agents']} agent(s), {f['verdicts']} verdicts in {f['wall_s']:.1f} s: "
                     f"{f['per_minute']:.2f}/min, per verdict p50 {f['p50_s']:.1f} s p95 {f['p95_s']:.1f} s; "
                     f"lane wait p50 {f['wait_p50_s']:.1f} s p95 {f['wait_p95_s']:.1f} s; "
                     f"lane held {f['lane_share']:.0%}, "
                     f"GPU busy {busy}; held beyond GPU phases <= {f['beyond_gpu_phases_max_s']:.2f} s, "
                     f"set-up under it <= {f['setup_under_lane_max_s']:.2f} s")
        lines.append(f"          verdicts {f['verdict_counts']}, errors {f['errors']}; worst agent's wait p95 over the "
                     f"median agent's: {f['worst_agent_wait_p95_over_median']}")
    if s["throughput_ratio"] is not None:
        lines.append(f"together / alone: {s['throughput_ratio']:.2f}x verdicts per minute; together's wall over its "
                     f"verdicts one after another: {s['wall_over_serial']:.2f}")
    return "\n".join(lines)


def main() -> None:
    """Runs the bench as the arguments say."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernelbench", type=Path, nargs="?", default=Path("/work/shared/kernelbench"))
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--per-agent", type=int, help="candidates per agent (default: the whole set, each agent "
                        "from its own offset; alone verifies the same set)")
    parser.add_argument("--alone", type=int, help="verdicts of the one agent alone (default: --per-agent)")
    parser.add_argument("--transport", choices=("http", "stdio"), default="http")
    parser.add_argument("--solutions", type=Path, action="append")
    parser.add_argument("--problems", help="KernelBench ids to keep, e.g. 9,12,88")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from kb_mcp.harness.gpu.gpu_probe import no_gpu_reason

    compile_only = args.compile_only or no_gpu_reason() is not None
    ids = {int(x) for x in args.problems.split(",")} if args.problems else None
    items = the_set(args.kernelbench, args.solutions or DEFAULT_SOLUTIONS, ids)
    if not items:
        sys.exit(f"no solution matched a problem of {args.kernelbench}")
    options: dict[str, Any] = {"compile_only": True} if compile_only else {}
    per_agent = args.per_agent or len(items)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:6]
    alone_streams = streams(items, 1, args.alone or per_agent, f"{run}-alone")
    together_streams = streams(items, args.agents, per_agent, f"{run}-together")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="agents-bench-") as tmp:
        home = Path(tmp)
        os.environ.setdefault("KB_MCP_HOME", str(home))
        os.environ.setdefault("KB_MCP_CACHE", str(home / "cache"))
        kb = home / "kb.json"
        server = HttpServer(kb, (args.out or home) / "server.log", args.kernelbench) \
            if args.transport == "http" else None
        try:
            connect = connector(args.transport, kb, server)
            warm = used(alone_streams, together_streams)
            _say(f"warm-up: {len(warm)} problems once each, {min(args.agents, len(warm))} agents at once "
                 "(workers, compilers probed, baselines)")
            runs.append(run_agents("warm-up", connect, warm_up_streams(warm, args.agents), options))
            _say(f"alone: 1 agent x {args.alone or per_agent}")
            runs.append(run_agents("alone", connect, alone_streams, options))
            write_results(args.out, runs, compile_only)
            _say(f"together: {args.agents} agents x {per_agent}")
            runs.append(run_agents("together", connect, together_streams, options))
        finally:
            if server is not None:
                server.close()
            write_results(args.out, runs, compile_only)
    print(report(summary(runs[1], runs[2], compile_only)))


def write_results(out: Path | None, runs: list[Run], compile_only: bool) -> None:
    """agents.json with the runs so far (the summary once both measured runs are in)."""
    if out is None or not runs:
        return
    measured = [r for r in runs if r.name != "warm-up"]
    body: dict[str, Any] = {"compile_only": compile_only, "runs": [r.model_dump(mode="json") for r in runs]}
    if len(measured) == 2:
        body = {**summary(measured[0], measured[1], compile_only), **body}
    else:
        body["figures"] = {r.name: r.figures() for r in runs}
    (out / "agents.json").write_text(json.dumps(body, indent=1))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
