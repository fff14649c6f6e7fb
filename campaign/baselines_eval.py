"""`kb-mcp eval --baselines` (and an eval given no solutions): eager and torch.compile of every selected
problem, timed on this GPU the way verifications time them, into one JSON table.

The table KernelBench users keep per GPU: one row per problem with its level, name, status (`ok`,
`too_large` with the numbers, `problem_error`, `harness_error`, or `needs_gpu` without a GPU), the
two medians in milliseconds and the peak GPU memory the run took. Each problem is timed in a verify
worker (`WorkerPool.baselines`) holding the machine-wide GPU lane, and its baseline is cached
exactly as a verification's first measurement would be, so later verdicts of the problem on this GPU
are judged against the same figures.

The table is written after every problem (atomically), so an interrupted run loses nothing and a
rerun of the same command skips the problems already timed (`ok`, `too_large`, `problem_error`) and
tries again those that ended in a harness error.

Given a cluster (`--gpus N`, `--cluster ADDRESS`), each problem is one task on a GPU worker of it,
as many at once as the cluster has slots (N GPUs time N problems at once, each alone on its own GPU);
the coordinator alone writes the table, a row as each task comes back, in the order they finish.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from kb_mcp.campaign.cluster_models import BaselinesJob, ClusterError
from kb_mcp.campaign.selection import ProblemRef, SelectionError, eval_mode, select_problems
from kb_mcp.harness.baselines import BaselineRun, BaselineStatus
from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.problem import ProblemError, load_problem
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.errors import Fault
from kb_mcp.kb.models import DEFAULT_MODE, DEFAULT_TRACK, Mode, Track
from kb_mcp.kb.progress import Progress
from kb_mcp.tools.context import ToolContext

if TYPE_CHECKING:
    from kb_mcp.campaign.cluster import Cluster

__all__ = ["BaselineRow", "BaselinesError", "baselines_table", "eta_text", "read_table"]

ProgressFn = Callable[[str, int, int, str], None]  # (problem, done, total, message), as an eval's
LogFn = Callable[[str], None]
DONE: tuple[BaselineStatus, ...] = ("ok", "too_large", "problem_error")
MAX_WAITING = 256  # problems waiting for a worker of the cluster at once (each a thread here)


class BaselinesError(Exception):
    """The baselines cannot be timed as asked (selection, output file); the message says what to change,
    `whose` who changes it (the CLI's exit status follows it)."""

    def __init__(self, message: str, *, whose: Fault = "caller") -> None:
        super().__init__(message)
        self.whose: Fault = whose


class BaselineRow(BaseModel):
    """One problem of the table."""

    model_config = ConfigDict(extra="forbid")

    level: int | None = Field(description="KernelBench level (None outside a KernelBench tree)")
    problem: str = Field(description="the problem's file stem")
    status: BaselineStatus
    eager_ms: float | None = None
    compile_ms: float | None = None
    peak_gib: float | None = Field(None, description="GPU memory the run took above the device's idle level (NVML), "
                                   "else the worker's allocator peak")
    note: str = Field("", description="why it is not ok (too_large: the numbers), or torch.compile's failure")
    device: str = ""
    track: Track = DEFAULT_TRACK
    mode: Mode = Field(DEFAULT_MODE, description="the mode the level is evaluated in (composed for level 3)")
    elapsed_s: float = 0.0
    worker: str = Field("", description="the cluster's worker that timed it (`--gpus N`, `--cluster`)")
    phases_s: dict[str, float] = Field(default_factory=dict, description=(
        "seconds per step, adding up to elapsed_s: lane (waiting for the GPU), worker_start, the worker's load, "
        "construct, eager, compile (torch.compile's first call), compile_timed, request_rest, worker_restart "
        "(waiting for a worker started meanwhile)"))
    worker_retired: str = Field("", description="why the worker exited after this problem and a new one started "
                                                "('' when it did not)")


_ROWS: TypeAdapter[list[BaselineRow]] = TypeAdapter(list[BaselineRow])


def read_table(path: Path) -> list[BaselineRow]:
    """The rows already in `path` (none where it does not exist); a file that is not such a table is refused."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    try:
        return _ROWS.validate_json(text)
    except ValueError as exc:
        raise BaselinesError(f"{path} is not a baselines table ({str(exc).splitlines()[0]}); give another --out "
                             "or move it away") from exc


def _write(path: Path, rows: list[BaselineRow]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps([r.model_dump(mode="json") for r in rows], indent=1) + "\n")


def eta_text(elapsed: list[float], left: int, lanes: int = 1) -> str:
    """'ETA 12 min' from the seconds the finished problems took (their mean times the problems left,
    over the `lanes` timing at once)."""
    if not elapsed:
        return "ETA unknown until a problem is done"
    seconds = sum(elapsed) / len(elapsed) * left / max(1, lanes)
    return f"ETA {seconds / 60:.0f} min" if seconds >= 90 else f"ETA {seconds:.0f} s"


def row_of(ref: ProblemRef, run: BaselineRun, track: Track) -> BaselineRow:
    """The table's row of one run."""
    base = run.baseline
    note = run.note or (base.compile_note if base is not None else "")
    return BaselineRow(level=ref.level, problem=ref.name,
                           mode=eval_mode(ref.level), status=run.status,
                       eager_ms=round(base.eager_ms, 5) if base else None,
                       compile_ms=round(base.compile_ms, 5) if base and base.compile_ms is not None else None,
                       peak_gib=run.peak_gib, note=note, device=run.device, track=track, elapsed_s=run.elapsed_s,
                       phases_s=run.phases, worker_retired=run.worker_retired)


def baselines_table(out: Path, ctx: ToolContext, problems: list[str | Path], *, level: int | None = None,
                    ids: str | None = None, track: Track = DEFAULT_TRACK, progress: ProgressFn | None = None,
                    log: LogFn | None = None, cluster: Cluster | None = None) -> list[BaselineRow]:
    """Times the baselines of each selected problem into the table at `out` (see the module's
    docstring): here, one after another, or on the workers of `cluster`."""
    try:
        refs = select_problems(problems, level=level, ids=ids)
    except SelectionError as exc:
        raise BaselinesError(str(exc), whose=exc.whose) from exc
    table = _Table(out)
    say = log or (lambda text: None)
    show = progress or (lambda *a: None)
    todo = [r for r in refs if not table.done(r)]
    if len(todo) < len(refs):
        say(f"{len(refs) - len(todo)} of {len(refs)} problems already in {out}: skipped")
    if cluster is None:
        _here(table, ctx, todo, track, show, say)
    else:
        _spread(table, cluster, todo, track, show, say)
    show("", len(todo), len(todo), "done")
    return table.ordered()


class _Table:
    """The table's rows by (level, problem), the file rewritten whole (atomically) after each new one."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.rows = {(r.level, r.problem): r for r in read_table(out)}

    def done(self, ref: ProblemRef) -> bool:
        """Whether the problem's row is final (a harness error, or no GPU, is tried again)."""
        row = self.rows.get((ref.level, ref.name))
        return row is not None and row.status in DONE

    def add(self, row: BaselineRow) -> None:
        """Adds (or replaces) the problem's row and writes the table."""
        self.rows[(row.level, row.problem)] = row
        _write(self.out, self.ordered())

    def ordered(self) -> list[BaselineRow]:
        """The rows by level, then problem number."""
        return sorted(self.rows.values(), key=lambda r: (r.level or 0, _number(r.problem), r.problem))


def _here(table: _Table, ctx: ToolContext, todo: list[ProblemRef], track: Track, show: ProgressFn,
          say: LogFn) -> None:
    """Each problem timed in this process's pool, one after another."""
    elapsed: list[float] = []
    for i, ref in enumerate(todo):
        show(ref.name, i, len(todo), eta_text(elapsed, len(todo) - i))
        t0 = time.monotonic()
        row = _one(ctx, ref, track, _Relay(show, ref.name, i, len(todo)))
        elapsed.append(time.monotonic() - t0)
        table.add(row)
        say(f"[{i + 1}/{len(todo)}] {_describe(row)}; {eta_text(elapsed, len(todo) - i - 1)}")


def _spread(table: _Table, cluster: Cluster, todo: list[ProblemRef], track: Track, show: ProgressFn,
            say: LogFn) -> None:
    """Each problem a task on the cluster's workers, as many at once as it has slots; each row written
    here (by this thread alone) as its task comes back."""
    if not todo:
        return
    lanes = max(1, cluster.capacity)
    show("", 0, len(todo), f"on {lanes} worker(s) of the cluster; ETA unknown until a problem is done")
    elapsed: list[float] = []
    with cf.ThreadPoolExecutor(min(len(todo), MAX_WAITING), thread_name_prefix="kb-mcp-baselines") as pool:
        running = [pool.submit(_remote, cluster, ref, track) for ref in todo]
        for i, future in enumerate(cf.as_completed(running)):
            row = future.result()
            elapsed.append(row.elapsed_s)
            table.add(row)
            eta = eta_text(elapsed, len(todo) - i - 1, lanes)
            say(f"[{i + 1}/{len(todo)}] {_describe(row)} [{row.worker}]; {eta}")
            show(row.problem, i + 1, len(todo), eta)


def _remote(cluster: Cluster, ref: ProblemRef, track: Track) -> BaselineRow:
    """One problem's baselines timed on a worker of the cluster (in a thread of this process)."""
    try:
        problem = load_problem(str(ref.path))
    except ProblemError as exc:
        return BaselineRow(level=ref.level, problem=ref.name,
                           mode=eval_mode(ref.level), status="problem_error", note=str(exc), track=track)
    t0 = time.monotonic()
    try:
        remote = cluster.baselines(BaselinesJob(problem=problem, options=VerifyOptions(track=track)))
    except ClusterError as exc:  # its workers kept dying: a rerun tries it again
        return BaselineRow(level=ref.level, problem=ref.name,
                           mode=eval_mode(ref.level), status="harness_error", note=str(exc), track=track,
                           elapsed_s=round(time.monotonic() - t0, 3))
    if remote.run is None:
        return BaselineRow(level=ref.level, problem=ref.name,
                           mode=eval_mode(ref.level), status="harness_error", track=track,
                           note=remote.error or f"the worker {remote.where} sent no result (ours to fix)",
                           worker=remote.where, elapsed_s=remote.seconds)
    return row_of(ref, remote.run, track).model_copy(update={"worker": remote.where})


class _Relay:
    """A run's progress (the lane's waits, its phases) shown as the problem's line of the eval's progress."""

    def __init__(self, show: ProgressFn, name: str, index: int, total: int) -> None:
        self.show, self.name, self.index, self.total = show, name, index, total

    def __call__(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self.show(self.name, self.index, self.total, message or "")


def _one(ctx: ToolContext, ref: ProblemRef, track: Track, progress: Progress) -> BaselineRow:
    try:
        problem = load_problem(str(ref.path))
    except ProblemError as exc:
        return BaselineRow(level=ref.level, problem=ref.name,
                           mode=eval_mode(ref.level), status="problem_error", note=str(exc), track=track)
    run = ctx.workers.baselines(problem, VerifyOptions(track=track), progress)  # it holds the GPU lane
    return row_of(ref, run, track)


def _number(stem: str) -> int:
    head = stem.split("_", 1)[0]
    return int(head) if head.isdigit() else 1 << 30


def _describe(row: BaselineRow) -> str:
    where = f"level {row.level} " if row.level is not None else ""
    if row.status == "ok":
        comp = f"{row.compile_ms:.3f} ms" if row.compile_ms is not None else "failed"
        steps = ", ".join(f"{k} {v:.1f}" for k, v in row.phases_s.items())
        return (f"{where}{row.problem}: eager {row.eager_ms:.3f} ms, torch.compile {comp}, "
                f"peak {row.peak_gib} GiB" + (f" ({row.elapsed_s:.1f} s: {steps})" if steps else "")
                + (f"; a new worker started after it ({row.worker_retired})" if row.worker_retired else ""))
    return f"{where}{row.problem}: {row.status} ({row.note[:200]})"
