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
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from kb_mcp.campaign.selection import ProblemRef, SelectionError, select_problems
from kb_mcp.harness.baselines import BaselineRun, BaselineStatus
from kb_mcp.harness.problem import ProblemError, load_problem
from kb_mcp.harness.verdict import VerifyOptions
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.models import DEFAULT_TRACK, Track
from kb_mcp.kb.progress import Progress
from kb_mcp.tools.context import ToolContext

__all__ = ["BaselineRow", "BaselinesError", "baselines_table", "eta_text", "read_table"]

ProgressFn = Callable[[str, int, int, str], None]  # (problem, done, total, message), as an eval's
LogFn = Callable[[str], None]
DONE: tuple[BaselineStatus, ...] = ("ok", "too_large", "problem_error")


class BaselinesError(Exception):
    """The baselines cannot be timed as asked (selection, output file); the message says what to change."""


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
    elapsed_s: float = 0.0


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


def eta_text(elapsed: list[float], left: int) -> str:
    """'ETA 12 min' from the seconds the finished problems took (their mean times the problems left)."""
    if not elapsed:
        return "ETA unknown until a problem is done"
    seconds = sum(elapsed) / len(elapsed) * left
    return f"ETA {seconds / 60:.0f} min" if seconds >= 90 else f"ETA {seconds:.0f} s"


def row_of(ref: ProblemRef, run: BaselineRun, track: Track) -> BaselineRow:
    """The table's row of one run."""
    base = run.baseline
    note = run.note or (base.compile_note if base is not None else "")
    return BaselineRow(level=ref.level, problem=ref.name, status=run.status,
                       eager_ms=round(base.eager_ms, 5) if base else None,
                       compile_ms=round(base.compile_ms, 5) if base and base.compile_ms is not None else None,
                       peak_gib=run.peak_gib, note=note, device=run.device, track=track, elapsed_s=run.elapsed_s)


def baselines_table(out: Path, ctx: ToolContext, problems: list[str | Path], *, level: int | None = None,
                    ids: str | None = None, track: Track = DEFAULT_TRACK, progress: ProgressFn | None = None,
                    log: LogFn | None = None) -> list[BaselineRow]:
    """Times the baselines of each selected problem into the table at `out` (see the module's docstring)."""
    try:
        refs = select_problems(problems, level=level, ids=ids)
    except SelectionError as exc:
        raise BaselinesError(str(exc)) from exc
    rows = {(r.level, r.problem): r for r in read_table(out)}
    say = log or (lambda text: None)
    show = progress or (lambda *a: None)
    todo = [r for r in refs if (r.level, r.name) not in rows or rows[(r.level, r.name)].status not in DONE]
    if len(todo) < len(refs):
        say(f"{len(refs) - len(todo)} of {len(refs)} problems already in {out}: skipped")
    elapsed: list[float] = []
    for i, ref in enumerate(todo):
        show(ref.name, i, len(todo), eta_text(elapsed, len(todo) - i))
        t0 = time.monotonic()
        row = _one(ctx, ref, track, _Relay(show, ref.name, i, len(todo)))
        elapsed.append(time.monotonic() - t0)
        rows[(ref.level, ref.name)] = row
        _write(out, sorted(rows.values(), key=lambda r: (r.level or 0, _number(r.problem), r.problem)))
        say(f"[{i + 1}/{len(todo)}] {_describe(row)}; {eta_text(elapsed, len(todo) - i - 1)}")
    show("", len(todo), len(todo), "done")
    return sorted(rows.values(), key=lambda r: (r.level or 0, _number(r.problem), r.problem))


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
        return BaselineRow(level=ref.level, problem=ref.name, status="problem_error", note=str(exc), track=track)
    run = ctx.workers.baselines(problem, VerifyOptions(track=track), progress)  # it holds the GPU lane
    return row_of(ref, run, track)


def _number(stem: str) -> int:
    head = stem.split("_", 1)[0]
    return int(head) if head.isdigit() else 1 << 30


def _describe(row: BaselineRow) -> str:
    where = f"level {row.level} " if row.level is not None else ""
    if row.status == "ok":
        comp = f"{row.compile_ms:.3f} ms" if row.compile_ms is not None else "failed"
        return (f"{where}{row.problem}: eager {row.eager_ms:.3f} ms, torch.compile {comp}, "
                f"peak {row.peak_gib} GiB")
    return f"{where}{row.problem}: {row.status} ({row.note[:200]})"
