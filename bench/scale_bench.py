"""Verification throughput on one GPU and on N GPUs of one machine, side by side in one run, and what
scheduling one task on the cluster costs.

    source .whl/prelude.sh && python3 bench/scale_bench.py ../shared/kernelbench --out "$OUT" \\
        [--gpus N] [--solutions bench/eval_pipeline_solutions] [--level 2] [--problems 9,12] [--echo 200]

In one process the same problems and solutions go through `kb-mcp eval` (`campaign.evaluate`) three
times, each with a KB and an eval folder of its own and one build cache shared by all:

1. a warm-up (today's path): every solution's extension built, every problem's baselines cached; not
   measured, so that both measured runs verify with the same warm caches;
2. one GPU: today's path, no cluster (`--cold`: no warm-up, and each run a build cache of its own, so
   that the builds are measured too);
3. N GPUs: a local Dask cluster of one worker per GPU (`--gpus`, default every GPU), exactly what
   `kb-mcp eval --gpus N` starts.

Each run's harness is started before its clock (the pool's worker, and each cluster worker's pool). It
prints, per run, the wall time, the problems verified per minute and the GPU-busy share (the
verifications' own time less their builds, `StepTimes.verify_s` summed, over wall x GPUs), then N GPUs' throughput over
one GPU's against the target 0.85 x N, and whether the verdicts agree (faster and slower as one).
Then the scheduling overhead: `--echo` tasks that do nothing, sent through the cluster's own path
(a slot held, the task submitted with the GPU resource, its answer, the scheduler asked whether its
worker died), one at a time (the latency of one task) and as many at once as the cluster has slots.

Without a GPU (or `--compile-only`) the verifications are compile-only checks on N CPU workers
(default 2), and it says so: the figures are the path's and the compilers', not GPUs' (busy: the
checks' whole time, compiling included). Writes scale.json
to --out.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eval_pipeline_bench import add_eval_set, solution_ids
from pydantic import BaseModel, ConfigDict

TARGET = 0.85  # N GPUs' throughput >= TARGET x N x one GPU's


class Run(BaseModel):
    """One eval of the set and what it measured."""

    model_config = ConfigDict(extra="forbid")

    name: str
    gpus: int
    start_s: float  # starting the harness (before the clock)
    wall_s: float
    verified: int
    busy_s: float  # the verifications' own time, summed
    devices: list[str]
    verdicts: dict[str, str | None]

    @property
    def per_minute(self) -> float:
        """Problems verified per minute of wall time."""
        return 60.0 * self.verified / self.wall_s if self.wall_s else 0.0

    @property
    def busy_share(self) -> float:
        """The share of the run's GPU time (wall x GPUs) spent verifying."""
        return self.busy_s / (self.wall_s * self.gpus) if self.wall_s else 0.0


def _options(args: argparse.Namespace) -> Any:
    from kb_mcp.campaign.evaluate import EvalOptions

    return EvalOptions(problems=list(args.problems), solutions=str(args.solutions), level=args.level, ids=args.ids,
                       compile_only=args.compile_only)


def one_gpu(name: str, args: argparse.Namespace, root: Path) -> Run:
    """The set through today's path (one GPU, no cluster), the harness started before the clock."""
    from kb_mcp.campaign.evaluate import evaluate
    from kb_mcp.harness.builds import toolchain
    from kb_mcp.tools.context import ToolContext

    ctx = ToolContext(root / name / "kb.json", client_name="scale bench")
    try:
        t0 = time.monotonic()
        info = ctx.workers.info()
        toolchain(ctx.sandbox)  # the compilers probed, as each cluster worker's warm-up does
        if info.cuda:
            ctx.workers.state()  # the census worker up too
        start = time.monotonic() - t0
        t0 = time.monotonic()
        result = evaluate(root / name / "out", ctx, _options(args), have_gpu=not args.compile_only, log=_log(name))
        wall = time.monotonic() - t0
    finally:
        ctx.close()
    return _run(name, 1, start, wall, result, [info.device or "no GPU"])


def many_gpus(name: str, args: argparse.Namespace, root: Path, workers: list[Any]) -> tuple[Run, dict[str, float]]:
    """The set through a local cluster of `workers` (what `--gpus N` starts), and the scheduling overhead."""
    from kb_mcp.campaign.cluster import Cluster
    from kb_mcp.campaign.cluster_models import ClusterPlan
    from kb_mcp.campaign.evaluate import evaluate
    from kb_mcp.tools.context import ToolContext

    ctx = ToolContext(root / name / "kb.json", client_name="scale bench")
    try:
        t0 = time.monotonic()
        with Cluster(ClusterPlan(workers=workers), ctx.private_places) as cluster:
            devices = sorted(cluster.warm().values())
            start = time.monotonic() - t0
            t0 = time.monotonic()
            result = evaluate(root / name / "out", ctx, _options(args), have_gpu=not args.compile_only,
                              log=_log(name), cluster=cluster)
            wall = time.monotonic() - t0
            overhead = scheduling(cluster, args.echo)
    finally:
        ctx.close()
    return _run(name, len(workers), start, wall, result, devices), overhead


def scheduling(cluster: Any, count: int) -> dict[str, float]:
    """`count` tasks that do nothing through the cluster's path: one at a time, then all slots at once."""
    cluster.echo("warm")
    t0 = time.perf_counter()
    for i in range(count):
        cluster.echo(str(i))
    serial = (time.perf_counter() - t0) / count
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(cluster.capacity) as pool:
        list(pool.map(cluster.echo, map(str, range(count))))
    wall = time.perf_counter() - t0
    return {"tasks": count, "ms_per_task_one_at_a_time": round(1000 * serial, 3),
            "tasks_per_s_all_slots": round(count / wall, 1), "slots": cluster.capacity}


def _run(name: str, gpus: int, start: float, wall: float, result: Any, devices: list[str]) -> Run:
    """What one eval measured. Busy: on a GPU the verifications less their builds (the GPU's work); in
    compile-only checks, where compiling is all the work, the builds too."""
    timed = [line.times for line in result.lines if line.times is not None]
    compile_only = result.report.mode == "compile-only"
    busy = sum(t.verify_s + (t.build_s if compile_only else 0.0) for t in timed)
    return Run(name=name, gpus=gpus, start_s=round(start, 3), wall_s=round(wall, 3), verified=len(timed),
               busy_s=round(busy, 3), devices=devices,
               verdicts={line.problem: line.verdict.value if line.verdict else None for line in result.lines
                         if line.times is not None})


def _log(name: str) -> Any:
    def show(text: str) -> None:
        print(f"[{name}] {text}", file=sys.stderr, flush=True)

    return show


def _kind(verdict: str | None) -> str | None:
    """faster and slower are one kind: two timings near 1.0x may fall either side."""
    return "valid" if verdict in ("faster", "slower") else verdict


def summary(one: Run, many: Run, overhead: dict[str, float], compile_only: bool) -> dict[str, Any]:
    """The headline numbers."""
    ratio = many.per_minute / one.per_minute if one.per_minute else None
    differ = sorted(p for p in set(one.verdicts) | set(many.verdicts)
                    if _kind(one.verdicts.get(p)) != _kind(many.verdicts.get(p)))
    return {
        "compile_only": compile_only, "gpus": many.gpus,
        "one": {"wall_s": one.wall_s, "per_minute": round(one.per_minute, 2), "busy_share": round(one.busy_share, 3)},
        "many": {"wall_s": many.wall_s, "per_minute": round(many.per_minute, 2),
                 "busy_share": round(many.busy_share, 3)},
        "ratio": round(ratio, 3) if ratio else None, "target": round(TARGET * many.gpus, 3),
        "met": bool(ratio and ratio >= TARGET * many.gpus) if not compile_only else None,
        "verdicts_differ": differ, "scheduling": overhead,
    }


def report(one: Run, many: Run, s: dict[str, Any]) -> str:
    """The text the bench prints."""
    what = "compile-only checks on CPU workers (no GPU: the path's figures, not GPUs')" if s["compile_only"] \
        else f"GPU verifications on {', '.join(many.devices)}"
    lines = [f"{what}; {many.verified} problems verified per run; busy share: the "
             + ("workers' compiling" if s["compile_only"] else "GPUs' verifying, builds excluded")
             + " over wall x workers"]
    for run in (one, many):
        lines.append(f"{run.name:<8} {run.gpus} worker(s): wall {run.wall_s:7.1f} s, "
                     f"{run.per_minute:6.2f} problems/min, busy share {run.busy_share:.0%} "
                     f"(harness started in {run.start_s:.1f} s, before the clock)")
    if s["ratio"] is not None:
        verdict = "not a GPU figure" if s["compile_only"] else ("met" if s["met"] else "NOT met")
        lines.append(f"throughput {many.gpus} / 1: {s['ratio']:.2f} (target >= {s['target']:.2f}: {verdict})")
    lines.append("verdicts agree: yes" if not s["verdicts_differ"] else
                 f"verdicts agree: NO ({', '.join(s['verdicts_differ'])})")
    o = s["scheduling"]
    lines.append(f"scheduling overhead: {o['ms_per_task_one_at_a_time']:.1f} ms per task one at a time, "
                 f"{o['tasks_per_s_all_slots']:.0f} tasks/s with {o['slots']} slots ({o['tasks']} no-op tasks)")
    return "\n".join(lines)


def _workers(args: argparse.Namespace) -> list[Any]:
    """The cluster's workers: one per GPU (`--gpus`), or `--gpus` CPU workers for compile-only checks."""
    from kb_mcp.campaign.cluster_models import local_workers, parse_gpus, visible_devices
    from kb_mcp.server.gpu import detect_gpus

    devices = [] if args.compile_only else visible_devices(len(detect_gpus()))
    count = parse_gpus(args.gpus) if args.gpus else (None if devices else 2)
    return local_workers(count, devices, compile_only=True)


def _cache(root: Path, run: str, cold: bool) -> None:
    """The build cache of the next run and of the workers it starts: one for all, or (cold) its own."""
    os.environ["KB_MCP_CACHE"] = str(root / (f"cache-{run}" if cold else "cache"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_eval_set(parser)
    parser.add_argument("--gpus", help="GPUs of the cluster run (default every GPU; without one: 2 CPU workers)")
    parser.add_argument("--echo", type=int, default=200, help="no-op tasks for the scheduling overhead")
    parser.add_argument("--compile-only", action="store_true", help="compile-only checks on CPU workers")
    parser.add_argument("--no-warm-up", action="store_true", help="skip the warm-up run (caches already warm)")
    parser.add_argument("--cold", action="store_true",
                        help="no warm-up, and a build cache of its own for each run: builds are measured too")
    parser.add_argument("--out", type=Path, help="folder for scale.json (and the runs' folders)")
    args = parser.parse_args(argv)
    from kb_mcp.server.gpu import detect_gpus

    args.compile_only = args.compile_only or not detect_gpus()
    args.ids = args.ids or solution_ids(args.solutions, args.level)
    root = (args.out or Path(tempfile.mkdtemp(prefix="scale-bench-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    workers = _workers(args)
    _cache(root, "warm-up", args.cold)
    if not (args.no_warm_up or args.cold):
        warm = one_gpu("warm-up", args, root)
        print(f"[warm-up] {warm.verified} verified in {warm.wall_s:.1f} s (builds and baselines cached)",
              file=sys.stderr, flush=True)
    _cache(root, "one", args.cold)
    one = one_gpu("one", args, root)
    _cache(root, "many", args.cold)
    many, overhead = many_gpus("many", args, root, workers)
    headline = summary(one, many, overhead, args.compile_only)
    print(report(one, many, headline))
    out = {"summary": headline, "runs": {"one": one.model_dump(), "many": many.model_dump()}}
    (root / "scale.json").write_text(json.dumps(out, indent=1))
    print(f"written: {root / 'scale.json'}")
    return 0 if headline["met"] in (True, None) and not headline["verdicts_differ"] else 1


if __name__ == "__main__":
    sys.exit(main())
