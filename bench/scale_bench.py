"""Verification throughput on one GPU and on N GPUs of one machine, side by side in one run (sized to
fit one device command of about 400 s), and what scheduling one task on the cluster costs.

    source .whl/prelude.sh && python3 bench/scale_bench.py --out "$OUT"                  # the default set
    python3 bench/scale_bench.py --out "$OUT" [--gpus N] [--copies 4] [--problems swish,softmax] [--budget 400]
    python3 bench/scale_bench.py ../shared/kernelbench --level 2 --solutions bench/eval_pipeline_solutions \\
        --problems 9,12 --out "$OUT"

The set: PROBLEMS with the solutions matched to them (by default five of `examples/problems` with
their `examples/candidates`: swish, softmax, elementwise_chain_small, elementwise_chain_deep and
row_sum), `--problems` picking some of them (names, or KernelBench ids and ranges), each verified
`--copies` times (a copy of the problem file and of its solution under a name of its own: the same
build and the same baselines, a verification of its own). In one process, with one build cache for
all:

1. the cluster (a local Dask cluster of one worker per GPU, `--gpus`, default every GPU: what
   `kb-mcp eval --gpus N` starts) is started and every worker's harness warmed (`Cluster.warm`);
2. warm-up: each problem once on the cluster, its workers concurrently: every solution built and
   every problem's baselines (eager, torch.compile) cached, once each;
3. probe: each problem once more on the cluster, warm: each problem's verification time, which
   orders the measured set longest first and sizes it: `--copies` is lowered where the two measured
   runs would not end within `--budget` seconds of the bench's start (said so);
4. N GPUs (measured): the set on the cluster; then the scheduling overhead (`--echo` no-op tasks
   through the cluster's own path, one at a time, then as many at once as it has slots);
5. one GPU (measured): the set through today's path (no cluster), the harness started before the clock;
6. with `--one-worker`, a diagnosis: the set once more on a cluster of one worker (the first of the
   N, with its share of the cores and the N workers' caches: the Dask path on one GPU, measured like
   step 4). One worker over one GPU is what the path itself costs (its thread share included); N
   workers over N times one worker is what they lose by sharing a host (memory bandwidth, PCIe, the
   coordinator).

`--cold`: no warm-up and no probe, each measured run a build cache of its own (builds measured too).
Printed per run: wall time, problems verified per minute, three shares of wall x GPUs: verifying (the
verifications' own time less their builds, what earlier runs called busy), the lane (the seconds the
verifications held the GPU lane) and GPU busy (the GPUs' own utilization, NVML sampled,
`harness.gpu.gpu_busy`), the first two per worker too, and each task's place on the
timeline (its worker, start and end); then N GPUs' throughput over one GPU's against the target
0.85 x N, and whether the verdicts agree (faster and slower as one). Without a GPU (or
`--compile-only`) the verifications are compile-only checks on N CPU workers (default 2), and it says
so: the figures are the path's and the compilers', not GPUs'. Writes scale.json to --out.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

TARGET = 0.85  # N GPUs' throughput >= TARGET x N x one GPU's
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
# the default set: example problem -> its example candidate (linear_sum is left out: its exact
# rewrite escalates to more input sets and shapes, a verification several times the others')
DEFAULT_PAIRS = {"swish": "swish_nvrtc", "softmax": "softmax_nvrtc",
                 "elementwise_chain_small": "elementwise_chain_small_nvrtc",
                 "elementwise_chain_deep": "elementwise_chain_deep_load_inline", "row_sum": "row_sum_load_inline"}
RESERVE_S = 45.0  # after the probe, besides the two measured runs: one GPU's harness start, the echo, the closes
SLACK = 1.2  # the probe's times stretched for the estimate (coordinator's work, variance)


class Task(BaseModel):
    """One verification on the run's timeline, as the coordinator saw it end."""

    model_config = ConfigDict(extra="forbid")

    problem: str
    worker: str
    start_s: float = Field(description="since the run's clock started: its end less its worker's seconds")
    end_s: float
    phases_s: dict[str, float] = Field(default_factory=dict, description="the verdict's seconds per phase")
    lane_s: float = Field(0.0, description="the seconds it held the GPU lane")


class Run(BaseModel):
    """One eval of the set and what it measured."""

    model_config = ConfigDict(extra="forbid")

    name: str
    gpus: int
    start_s: float  # starting the harness (before the clock)
    wall_s: float
    verified: int
    busy_s: float  # the verifications' own time, summed (what the bench called busy before the lane held GPU work only)
    lane_s: float = 0.0  # the seconds the verifications held the GPU lane, summed
    gpu_busy: float | None = None  # the GPUs' own utilization over the run (NVML, `harness.gpu.gpu_busy`); None without
    devices: list[str]
    verdicts: dict[str, str | None]
    busy_by_worker: dict[str, float] = Field(default_factory=dict)
    tasks: list[Task] = Field(default_factory=list)

    @property
    def per_minute(self) -> float:
        """Problems verified per minute of wall time."""
        return 60.0 * self.verified / self.wall_s if self.wall_s else 0.0

    @property
    def busy_share(self) -> float:
        """The share of the run's GPU time (wall x GPUs) spent verifying."""
        return self.busy_s / (self.wall_s * self.gpus) if self.wall_s else 0.0

    @property
    def lane_share(self) -> float:
        """The share of the run's GPU time (wall x GPUs) the lane was held."""
        return self.lane_s / (self.wall_s * self.gpus) if self.wall_s else 0.0

    def worker_shares(self) -> dict[str, float]:
        """Each worker's busy share of the run's wall time."""
        return {w: round(s / self.wall_s, 3) if self.wall_s else 0.0 for w, s in sorted(self.busy_by_worker.items())}


# -- the set --------------------------------------------------------------------------------------

class Pair(BaseModel):
    """One problem of the set and the solution matched to it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    problem: Path
    solution: Path


def default_set(folder: Path) -> tuple[list[str | Path], Path]:
    """The example problems and a solutions folder holding each one's example candidate under its name."""
    folder.mkdir(parents=True, exist_ok=True)
    for problem, candidate in DEFAULT_PAIRS.items():
        shutil.copy(EXAMPLES / "candidates" / f"{candidate}.py", folder / f"{problem}.py")
    return [str(EXAMPLES / "problems" / f"{p}.py") for p in DEFAULT_PAIRS], folder


def pairs_of(problems: list[str | Path], solutions: Path, level: int | None, pick: str | None) -> list[Pair]:
    """The selected problems that have a solution; `pick`: names, or ids and ranges."""
    from kb_mcp.campaign.selection import match_solution, parse_ids, select_problems

    refs = select_problems(problems, level=level)
    if pick:
        tokens = [t.strip() for t in pick.split(",") if t.strip()]
        numeric = all(t.replace("-", "").isdigit() for t in tokens)
        wanted_ids = parse_ids(pick) if numeric else set()
        refs = [r for r in refs if (r.id in wanted_ids if numeric else r.name in tokens)]
    pairs = [Pair(name=r.name, problem=r.path, solution=s) for r in refs
             if (s := match_solution(r, solutions)) is not None]
    if not pairs:
        raise SystemExit(f"no selected problem has a solution in {solutions} (--problems {pick or 'all'})")
    return pairs


def write_set(folder: Path, pairs: list[Pair], copies: int) -> Path:
    """`copies` of each pair under names of their own, in the order given (numbered, so the eval keeps
    it): problems in `folder/problems`, solutions in `folder/solutions`. Returns `folder`."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "problems").mkdir(parents=True)
    (folder / "solutions").mkdir()
    n = 0
    for pair in pairs:
        for k in range(copies):
            n += 1
            name = f"{n}_{pair.name}_c{k}.py"
            shutil.copy(pair.problem, folder / "problems" / name)
            shutil.copy(pair.solution, folder / "solutions" / name)
    return folder


def base_name(copy: str) -> str:
    """`3_swish_c1` -> `swish`."""
    return copy.split("_", 1)[1].rsplit("_c", 1)[0]


# -- the runs -------------------------------------------------------------------------------------

class Timeline:
    """The tasks of one run, each noted as it ends (its start: its end less its worker's seconds)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.tasks: list[Task] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        self.t0 = time.monotonic()

    def add(self, problem: str, worker: str, seconds: float, result: Any = None) -> None:
        end = time.monotonic() - self.t0
        lane = result.lane if result is not None else None
        with self._lock:
            self.tasks.append(Task(problem=problem, worker=worker, start_s=round(max(0.0, end - seconds), 3),
                                   end_s=round(end, 3), phases_s=result.phases_s if result is not None else {},
                                   lane_s=lane.held_s if lane is not None else 0.0))


@contextmanager
def timed_cluster(cluster: Any, timeline: Timeline) -> Iterator[None]:
    """Notes each verification the cluster runs in the block on `timeline` (its `verify`, wrapped)."""
    verify = cluster.verify

    def timed(job: Any) -> Any:
        remote = verify(job)
        timeline.add(job.problem.name, remote.worker, remote.seconds, remote.result)
        return remote

    cluster.__dict__["verify"] = timed
    try:
        yield
    finally:
        del cluster.__dict__["verify"]


def timed_pool(pool: Any, timeline: Timeline) -> None:
    """Notes each verification this process's pool runs on `timeline`."""
    verify = pool.verify

    def timed(problem: Any, source: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        result = verify(problem, source, *args, **kwargs)
        timeline.add(problem.name, "local", time.monotonic() - t0, result)
        return result

    pool.__dict__["verify"] = timed


def _options(folder: Path, compile_only: bool) -> Any:
    from kb_mcp.campaign.eval_models import EvalOptions

    return EvalOptions(problems=[str(folder / "problems")], solutions=str(folder / "solutions"),
                       compile_only=compile_only)


def one_gpu(name: str, folder: Path, root: Path, compile_only: bool) -> Run:
    """The set through today's path (one GPU, no cluster), the harness started before the clock."""
    from kb_mcp.campaign.evaluate import evaluate
    from kb_mcp.harness.builds.builds import toolchain
    from kb_mcp.harness.gpu.gpu_busy import GpuBusy
    from kb_mcp.tools.context import ToolContext

    ctx = ToolContext(root / name / "kb.json", client_name="scale bench")
    timeline = Timeline()
    try:
        t0 = time.monotonic()
        info = ctx.workers.info()
        toolchain(ctx.sandbox)  # the compilers probed, as each cluster worker's warm-up does
        if info.cuda:
            ctx.workers.state()  # the census worker up too
        start = time.monotonic() - t0
        timed_pool(ctx.workers, timeline)
        timeline.start()
        with GpuBusy() as busy:
            result = evaluate(root / name / "out", ctx, _options(folder, compile_only), have_gpu=not compile_only,
                              log=_log(name))
        wall = time.monotonic() - timeline.t0
    finally:
        ctx.close()
    return _run(name, 1, start, wall, result, [info.device or "no GPU"], timeline, busy.share(1))


def on_cluster(name: str, cluster: Any, folder: Path, root: Path, compile_only: bool, devices: list[str]) -> Run:
    """The set through the cluster (what `--gpus N` runs), timed from its first task to its report."""
    from kb_mcp.campaign.evaluate import evaluate
    from kb_mcp.harness.gpu.gpu_busy import GpuBusy
    from kb_mcp.tools.context import ToolContext

    ctx = ToolContext(root / name / "kb.json", client_name="scale bench")
    timeline = Timeline()
    try:
        with timed_cluster(cluster, timeline), GpuBusy() as busy:
            result = evaluate(root / name / "out", ctx, _options(folder, compile_only), have_gpu=not compile_only,
                              log=_log(name), cluster=cluster)
        wall = time.monotonic() - timeline.t0
    finally:
        ctx.close()
    return _run(name, len(devices), 0.0, wall, result, devices, timeline, busy.share(len(devices)))


def scheduling(cluster: Any, count: int) -> dict[str, float]:
    """`count` tasks that do nothing through the cluster's path: one at a time, then all slots at once."""
    cluster.echo("warm")
    t0 = time.perf_counter()
    for i in range(count):
        cluster.echo(str(i))
    serial = (time.perf_counter() - t0) / max(1, count)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max(1, cluster.capacity)) as pool:
        list(pool.map(cluster.echo, map(str, range(count))))
    wall = time.perf_counter() - t0
    return {"tasks": count, "ms_per_task_one_at_a_time": round(1000 * serial, 3),
            "tasks_per_s_all_slots": round(count / wall, 1) if wall else 0.0, "slots": cluster.capacity}


def _worker_of(line: Any) -> str:
    return line.worker.split(" ")[0] if line.worker else "local"


def _run(name: str, gpus: int, start: float, wall: float, result: Any, devices: list[str],
         timeline: Timeline | None = None, gpu_busy: float | None = None) -> Run:
    """What one eval measured. Busy: on a GPU the verifications less their builds (the GPU's work); in
    compile-only checks, where compiling is all the work, the builds too."""
    compile_only = result.report.mode == "compile-only"
    timed = [line for line in result.lines if line.times is not None]
    by_worker: dict[str, float] = {}
    for line in timed:
        t = line.times
        by_worker[_worker_of(line)] = by_worker.get(_worker_of(line), 0.0) + t.verify_s + (
            t.build_s if compile_only else 0.0)
    return Run(name=name, gpus=gpus, start_s=round(start, 3), wall_s=round(wall, 3), verified=len(timed),
               busy_s=round(sum(by_worker.values()), 3), devices=devices, gpu_busy=gpu_busy,
               lane_s=round(sum(t.lane_s for t in timeline.tasks), 3) if timeline else 0.0,
               busy_by_worker={w: round(s, 3) for w, s in by_worker.items()},
               tasks=sorted(timeline.tasks, key=lambda t: t.start_s) if timeline else [],
               verdicts={line.problem: line.verdict.value if line.verdict else None for line in timed})


def _log(name: str) -> Callable[[str], None]:
    def show(text: str) -> None:
        print(f"[{name}] {text}", file=sys.stderr, flush=True)

    return show


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the reading ----------------------------------------------------------------------------------

def _kind(verdict: str | None) -> str | None:
    """faster and slower are one kind: two timings near 1.0x may fall either side."""
    return "valid" if verdict in ("faster", "slower") else verdict


def summary(one: Run, many: Run, overhead: dict[str, float], compile_only: bool,
            lone: Run | None = None) -> dict[str, Any]:
    """The headline numbers; with the one-worker run, the path's own cost and the host's sharing."""
    ratio = many.per_minute / one.per_minute if one.per_minute else None
    differ = sorted(p for p in set(one.verdicts) | set(many.verdicts)
                    if _kind(one.verdicts.get(p)) != _kind(many.verdicts.get(p)))
    diagnosis: dict[str, Any] = {}
    if lone is not None and lone.per_minute and one.per_minute:
        diagnosis = {"one_worker": {"wall_s": lone.wall_s, "per_minute": round(lone.per_minute, 2),
                                    "busy_share": round(lone.busy_share, 3)},
                     "path": round(lone.per_minute / one.per_minute, 3),  # the Dask path on one GPU over today's
                     "sharing": round(many.per_minute / (many.gpus * lone.per_minute), 3)}  # N workers over N x one
    return {**diagnosis,
        "compile_only": compile_only, "gpus": many.gpus,
        "one": {"wall_s": one.wall_s, "per_minute": round(one.per_minute, 2), "busy_share": round(one.busy_share, 3),
                "lane_share": round(one.lane_share, 3), "gpu_busy": one.gpu_busy, "by_worker": one.worker_shares()},
        "many": {"wall_s": many.wall_s, "per_minute": round(many.per_minute, 2),
                 "busy_share": round(many.busy_share, 3), "lane_share": round(many.lane_share, 3),
                 "gpu_busy": many.gpu_busy, "by_worker": many.worker_shares()},
        "ratio": round(ratio, 3) if ratio else None, "target": round(TARGET * many.gpus, 3),
        "met": bool(ratio and ratio >= TARGET * many.gpus) if not compile_only else None,
        "verdicts_differ": differ, "scheduling": overhead,
    }


def phase_means(run: Run, top: int = 6) -> dict[str, float]:
    """The run's mean seconds per verification in each phase, the `top` largest: where a cluster
    worker's verification spends more than the same verification on one GPU."""
    tasks = [t for t in run.tasks if t.phases_s]
    totals: dict[str, float] = {}
    for t in tasks:
        for phase, secs in t.phases_s.items():
            totals[phase] = totals.get(phase, 0.0) + secs
    means = sorted(((v / len(tasks), k) for k, v in totals.items()), reverse=True)[:top]
    return {k: round(v, 3) for v, k in means}


def report(one: Run, many: Run, s: dict[str, Any], lone: Run | None = None) -> str:
    """The text the bench prints."""
    what = "compile-only checks on CPU workers (no GPU: the path's figures, not GPUs')" if s["compile_only"] \
        else f"GPU verifications on {', '.join(many.devices)}"
    lines = [f"{what}; {many.verified} problems verified per run; verifying: the "
             + ("workers' compiling" if s["compile_only"] else "verifications' time, builds excluded")
             + " over wall x workers; lane: the GPU lane held over wall x GPUs; GPU busy: the GPUs' own utilization "
               "(NVML: kernels running), '-' without NVML"]
    for run in (one, many) if lone is None else (one, lone, many):
        lines.append(f"{run.name:<10} {run.gpus} worker(s): wall {run.wall_s:7.1f} s, "
                     f"{run.per_minute:6.2f} problems/min, verifying {run.busy_share:.0%}, lane {run.lane_share:.0%}, "
                     f"GPU busy {'-' if run.gpu_busy is None else format(run.gpu_busy, '.0%')} "
                     f"(harness started in {run.start_s:.1f} s, before the clock)")
        phases = phase_means(run)
        if phases:
            lines.append("           mean s per verification: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
        shares = run.worker_shares()
        if shares:
            lines.append("           per worker: " + ", ".join(
                f"{w} {share:.0%} ({sum(t.worker == w for t in run.tasks)} tasks)"
                for w, share in shares.items()))
    if s["ratio"] is not None:
        verdict = "not a GPU figure" if s["compile_only"] else ("met" if s["met"] else "NOT met")
        lines.append(f"throughput {many.gpus} / 1: {s['ratio']:.2f} (target >= {s['target']:.2f}: {verdict})")
    if "path" in s:
        lines.append(f"diagnosis: one worker of the cluster / one GPU {s['path']:.2f} (the path's own cost); "
                     f"{many.gpus} workers / {many.gpus} x one worker {s['sharing']:.2f} (sharing the host)")
    lines.append("verdicts agree: yes" if not s["verdicts_differ"] else
                 f"verdicts agree: NO ({', '.join(s['verdicts_differ'])})")
    o = s["scheduling"]
    lines.append(f"scheduling overhead: {o['ms_per_task_one_at_a_time']:.1f} ms per task one at a time, "
                 f"{o['tasks_per_s_all_slots']:.0f} tasks/s with {o['slots']} slots ({o['tasks']} no-op tasks)")
    return "\n".join(lines)


def timeline_text(run: Run, width: int = 60) -> str:
    """Each worker's row of the run (`#` busy, `.` idle) and each task's start and end."""
    if not run.tasks or not run.wall_s:
        return f"[{run.name}] no tasks timed"
    rows = [f"[{run.name}] timeline over {run.wall_s:.1f} s ('#' a verification running on the worker)"]
    for worker in sorted({t.worker for t in run.tasks}):
        cells = ["."] * width
        for t in (t for t in run.tasks if t.worker == worker):
            lo = int(t.start_s / run.wall_s * width)
            hi = max(lo + 1, int(t.end_s / run.wall_s * width + 0.5))
            for i in range(lo, min(hi, width)):
                cells[i] = "#"
        rows.append(f"  {worker:<8} |{''.join(cells)}|")
    rows += [f"  {t.start_s:7.1f} - {t.end_s:7.1f} s  {t.worker:<8} {t.problem}" for t in run.tasks]
    return "\n".join(rows)


# -- the bench ------------------------------------------------------------------------------------

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


def fit_copies(wanted: int, per_set_s: float, gpus: int, left_s: float, ones: int = 1) -> int:
    """The most copies (at most `wanted`, at least 1) whose measured runs, `ones` runs of one GPU's (the
    set's time each) and N GPUs' (a share of it), fit in `left_s`, from one set's probed time."""
    per_copy = per_set_s * (ones + 1.0 / max(1, gpus)) * SLACK
    if per_copy <= 0:
        return wanted
    return max(1, min(wanted, int(left_s // per_copy)))


def _probed(run: Run) -> dict[str, float]:
    """Each problem's verification time in a probe run (its worker's seconds), by base name."""
    return {base_name(t.problem): t.end_s - t.start_s for t in run.tasks}


def warm_and_size(cluster: Any, pairs: list[Pair], args: argparse.Namespace, root: Path,
                  devices: list[str], t_start: float) -> tuple[list[Pair], int]:
    """Warm-up and probe on the cluster; the pairs longest first and the copies that fit the budget."""
    if args.cold or args.no_warm_up:
        return pairs, args.copies
    warm = on_cluster("warm-up", cluster, write_set(root / "set-warm", pairs, 1), root, args.compile_only, devices)
    _say(f"[warm-up] {warm.verified} verified in {warm.wall_s:.1f} s on {len(devices)} worker(s) "
         "(builds and baselines cached)")
    probe = on_cluster("probe", cluster, write_set(root / "set-probe", pairs, 1), root, args.compile_only, devices)
    times = _probed(probe)
    ordered = sorted(pairs, key=lambda p: -times.get(p.name, 0.0))
    left = args.budget - (time.monotonic() - t_start) - RESERVE_S
    ones = 2 if args.one_worker else 1
    copies = fit_copies(args.copies, sum(times.values()), len(devices), left - (RESERVE_S if ones > 1 else 0.0), ones)
    one_s = copies * sum(times.values())
    _say(f"[probe] per problem: {', '.join(f'{k} {v:.1f} s' for k, v in sorted(times.items()))}; "
         f"{copies} cop{'y' if copies == 1 else 'ies'} of each (asked {args.copies}): estimated one GPU "
         f"{one_s:.0f} s, {len(devices)} GPUs {one_s / max(1, len(devices)):.0f} s, {left:.0f} s left of "
         f"--budget {args.budget:.0f} s")
    return ordered, copies


def bench(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The whole bench (see the module's docstring); the JSON it writes."""
    from kb_mcp.campaign.cluster import Cluster
    from kb_mcp.campaign.cluster_models import ClusterPlan
    from kb_mcp.tools.context import ToolContext

    t_start = time.monotonic()
    problems, solutions = (args.problems, args.solutions) if args.problems else default_set(root / "default-solutions")
    pairs = pairs_of(problems, solutions, args.level, args.pick)
    workers = _workers(args)
    _cache(root, "many", args.cold)
    host = ToolContext(root / "host" / "kb.json", client_name="scale bench")
    private = [*host.private_places, *(root / run for run in ("warm-up", "probe", "many", "one-worker"))]
    try:
        with Cluster(ClusterPlan(workers=workers), private) as cluster:
            t0 = time.monotonic()
            devices = sorted(cluster.warm().values())
            _say(f"[cluster] {len(devices)} worker(s) warm in {time.monotonic() - t0:.1f} s: {', '.join(devices)}")
            pairs, copies = warm_and_size(cluster, pairs, args, root, devices, t_start)
            folder = write_set(root / "set", pairs, copies)
            many = on_cluster("many", cluster, folder, root, args.compile_only, devices)
            overhead = scheduling(cluster, args.echo)
    finally:
        host.close()
    _say(timeline_text(many))
    _cache(root, "one", args.cold)
    one = one_gpu("one", folder, root, args.compile_only)
    _say(timeline_text(one))
    lone = one_worker(workers[0], private, folder, root, args) if args.one_worker else None
    headline = summary(one, many, overhead, args.compile_only, lone)
    headline.update(copies=copies, problems=[p.name for p in pairs], bench_s=round(time.monotonic() - t_start, 1))
    print(report(one, many, headline, lone))
    runs = {"one": one.model_dump(), "many": many.model_dump()}
    if lone is not None:
        runs["one-worker"] = lone.model_dump()
    return {"summary": headline, "runs": runs}


def one_worker(worker: Any, private: list[Any], folder: Path, root: Path, args: argparse.Namespace) -> Run:
    """The diagnosis run: the set on a cluster of one worker (the first of the N), its harness warmed,
    with the N workers' caches (their builds; the baselines of its GPU)."""
    from kb_mcp.campaign.cluster import Cluster
    from kb_mcp.campaign.cluster_models import ClusterPlan

    _cache(root, "many", args.cold)
    with Cluster(ClusterPlan(workers=[worker]), private) as cluster:
        t0 = time.monotonic()
        devices = sorted(cluster.warm().values())
        start = time.monotonic() - t0
        lone = on_cluster("one-worker", cluster, folder, root, args.compile_only, devices)
    _say(timeline_text(lone))
    return lone.model_copy(update={"start_s": round(start, 3)})


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="*", help="problem files or folders, or a KernelBench checkout "
                        "(default: five of examples/problems with their examples/candidates)")
    parser.add_argument("--solutions", type=Path, help="solution files matched by name (with PROBLEMS)")
    parser.add_argument("--level", type=int, help="KernelBench level (with a checkout)")
    parser.add_argument("--problems", dest="pick", help="problems of the set: names (swish,softmax) or ids (9,12-14)")
    parser.add_argument("--copies", type=int, default=4, help="verifications of each problem per run (default 4)")
    parser.add_argument("--budget", type=float, default=400.0,
                        help="seconds the whole bench should take: --copies is lowered to fit (default 400)")
    parser.add_argument("--gpus", help="GPUs of the cluster run (default every GPU; without one: 2 CPU workers)")
    parser.add_argument("--echo", type=int, default=200, help="no-op tasks for the scheduling overhead")
    parser.add_argument("--compile-only", action="store_true", help="compile-only checks on CPU workers")
    parser.add_argument("--no-warm-up", action="store_true", help="skip the warm-up and the probe (caches warm)")
    parser.add_argument("--cold", action="store_true",
                        help="no warm-up, and a build cache of its own for each run: builds are measured too")
    parser.add_argument("--one-worker", action="store_true",
                        help="also the set on a cluster of one worker: the path's own cost apart from the host's "
                             "sharing (a third measured run)")
    parser.add_argument("--out", type=Path, help="folder for scale.json (and the runs' folders)")
    args = parser.parse_args(argv)
    if args.problems and args.solutions is None:
        parser.error("PROBLEMS needs --solutions (the default set brings its own)")
    if args.copies < 1:
        parser.error("--copies takes 1 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from kb_mcp.server.gpu import detect_gpus

    args.compile_only = args.compile_only or not detect_gpus()
    root = (args.out or Path(tempfile.mkdtemp(prefix="scale-bench-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    out = bench(args, root)
    (root / "scale.json").write_text(json.dumps(out, indent=1))
    print(f"written: {root / 'scale.json'} (the bench took {out['summary']['bench_s']:.0f} s)")
    s = out["summary"]
    return 0 if s["met"] in (True, None) and not s["verdicts_differ"] else 1


if __name__ == "__main__":
    sys.exit(main())
