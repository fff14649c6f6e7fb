"""Retention: what `kb-mcp kb gc` removes, by age and size, and what it never touches.

Each kind of leftover is one `Rule` (a name and a function that finds what may go); `collect`
runs the rules and removes what they found (or only lists it, with `dry_run`). Adding a kind of
leftover is adding a rule to `default_rules`.

Never removed: anything a KB record points to (the sources and reports of candidates that an
outcome or a lesson names or a composition takes, records still waiting to be committed), jobs that are not finished,
and the scratch folder of a worker process that is still running (only its old files go).
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kb_mcp.kb.errors import CallerError
from kb_mcp.kb.owners import process_alive

if TYPE_CHECKING:  # `kb-mcp kb` reads `Limits` for its help; the store and job records load when gc runs
    from kb_mcp.kb.store import KBStore

DAY_S = 86400.0


@dataclass(frozen=True)
class Retention:
    """Ages (days) and sizes past which leftovers go."""

    job_days: float = 14.0
    jobs_kept: int = 500  # newest finished job records kept whatever their age
    candidate_days: float = 30.0  # sources and reports of candidates the KB does not need
    scratch_hours: float = 6.0  # files in a running worker's scratch folder
    cache_days: float = 30.0  # build and baseline cache entries not used for this long
    cache_max_mb: float | None = None  # and the oldest beyond this total size

    def __post_init__(self) -> None:
        # A negative age or count would let every record go (`kb gc --jobs-kept -5` kept none): refused.
        for name, value in vars(self).items():
            if value is not None and not 0 <= value < math.inf:
                flag = "--" + name.replace("_", "-")  # each field is the `kb gc` option of that name
                raise CallerError(f"{flag} {value:g}: must be a number, 0 or more", where=flag,
                                  action=f"give {flag} 0 or more, or leave it out for the default")


@dataclass(frozen=True)
class Item:
    """One file or folder a rule lets go."""

    path: Path
    size: int
    why: str


@dataclass
class GcReport:
    """What `collect` removed (or would remove), per rule."""

    removed: dict[str, list[Item]] = field(default_factory=dict)
    kept_referenced: int = 0
    errors: list[str] = field(default_factory=list)

    def total(self) -> tuple[int, int]:
        """(items, bytes)."""
        items = [i for group in self.removed.values() for i in group]
        return len(items), sum(i.size for i in items)


@dataclass(frozen=True)
class GcScope:
    """Where the rules look."""

    store: KBStore
    artifacts: Path
    cache: Path
    limits: Retention
    now: float = field(default_factory=time.time)


Rule = tuple[str, Callable[[GcScope, GcReport], Iterable[Item]]]


def _size(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    try:
        return path.lstat().st_size
    except FileNotFoundError:
        return 0


def _age_s(path: Path, now: float) -> float:
    try:
        return now - path.lstat().st_mtime
    except FileNotFoundError:
        return 0.0


# ---- rules --------------------------------------------------------------------------------------


def job_records(ctx: GcScope, report: GcReport) -> Iterator[Item]:
    """Finished job records older than `job_days`, and the oldest beyond `jobs_kept`."""
    from kb_mcp.server.job_store import JobStore

    jobs = JobStore(ctx.artifacts / "jobs")
    for job_id, why in jobs.expired(ctx.limits.job_days * DAY_S, ctx.limits.jobs_kept, ctx.now):
        for path in jobs.files_of(job_id):
            yield Item(path, _size(path), why)


def unrecorded_candidates(ctx: GcScope, report: GcReport) -> Iterator[Item]:
    """Sources and reports of candidates the KB does not need (`tools.candidate_store.Needs`: no
    outcome or lesson names them, no verdict of theirs waits, no composition takes them), older
    than `candidate_days` (their verdict stays in the KB)."""
    folder = ctx.artifacts / "candidates"
    if not folder.is_dir():
        return
    from kb_mcp.tools.candidate_store import Needs  # the one place that decides what the KB needs

    with ctx.store.read() as view:
        needs = Needs(view, ctx.store.pending_dir)
        needed = {cid for cid in {p.name.split(".")[0] for p in folder.iterdir()} if needs.why(cid) is not None}
    for path in folder.iterdir():
        cid = path.name.split(".")[0]
        if cid in needed:
            report.kept_referenced += 1
            continue
        if path.name.startswith(".") or _age_s(path, ctx.now) < ctx.limits.candidate_days * DAY_S:
            continue
        yield Item(path, _size(path), f"candidate {cid}: nothing in the KB needs it, "
                   f"{_age_s(path, ctx.now) / DAY_S:.0f} days old")


def worker_scratch(ctx: GcScope, report: GcReport) -> Iterator[Item]:
    """Scratch folders of worker processes that are gone, and old files in those of running ones."""
    root = ctx.cache / "work"
    if not root.is_dir():
        return
    for folder in root.iterdir():
        if folder.name.isdigit() and not process_alive(int(folder.name)):
            yield Item(folder, _size(folder), f"scratch of worker {folder.name}, which has exited")
            continue
        for path in folder.rglob("*") if folder.is_dir() else ():
            if path.is_file() and _age_s(path, ctx.now) > ctx.limits.scratch_hours * 3600:
                yield Item(path, _size(path), f"scratch file unused for {_age_s(path, ctx.now) / 3600:.0f} h")


CACHE_FOLDERS = ("torch_extensions", "inline_src", "compile_only", "baselines")
"""Build and baseline caches under the cache dir: each entry is rebuilt when needed again."""


def build_cache(ctx: GcScope, report: GcReport) -> Iterator[Item]:
    """Cache entries unused for `cache_days`, then the oldest beyond `cache_max_mb` in total."""
    entries = [e for name in CACHE_FOLDERS if (ctx.cache / name).is_dir() for e in (ctx.cache / name).iterdir()]
    by_age = sorted(entries, key=lambda e: _age_s(e, ctx.now), reverse=True)
    recent_s = 3600.0  # an entry touched in the last hour may be in use (a build, a loaded extension)
    kept: list[tuple[Path, int]] = []
    for entry in by_age:
        age = _age_s(entry, ctx.now)
        if age > ctx.limits.cache_days * DAY_S:
            yield Item(entry, _size(entry), f"cache entry unused for {age / DAY_S:.0f} days")
        else:
            kept.append((entry, _size(entry)))
    if ctx.limits.cache_max_mb is None:
        return
    total = sum(size for _, size in kept)
    budget = ctx.limits.cache_max_mb * 1e6
    for entry, size in kept:  # oldest first
        if total <= budget:
            break
        if _age_s(entry, ctx.now) < recent_s:
            continue
        total -= size
        yield Item(entry, size, f"cache over {ctx.limits.cache_max_mb:g} MB: oldest entries go first")


def default_rules() -> list[Rule]:
    """Every kind of leftover `kb-mcp kb gc` knows."""
    return [
        ("job records", job_records),
        ("unrecorded candidates", unrecorded_candidates),
        ("worker scratch", worker_scratch),
        ("build cache", build_cache),
    ]


def collect(ctx: GcScope, rules: Iterable[Rule] | None = None, *, dry_run: bool = False) -> GcReport:
    """Runs the rules; removes what they found unless `dry_run`."""
    report = GcReport()
    for name, rule in rules if rules is not None else default_rules():
        items = list(rule(ctx, report))
        report.removed[name] = items
        if dry_run:
            continue
        for item in items:
            try:
                if item.path.is_dir() and not item.path.is_symlink():
                    shutil.rmtree(item.path)
                else:
                    item.path.unlink(missing_ok=True)
            except OSError as exc:
                report.errors.append(f"{item.path}: {exc.strerror or exc}")
    return report
