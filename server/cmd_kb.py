"""`kb-mcp kb`: create, inspect, back up, restore, repair, export, import, merge and clean up
Knowledge Base files.

Exit status: 0 success, 1 the command line is wrong (the caller's mistake), 3 the environment's
fault (KB file, disk, lock, permissions; the message says what to do), 4 a kb-mcp bug.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kb_mcp.kb import paths
from kb_mcp.server import exit_status
from kb_mcp.server.gc import Retention

# Each action imports what it needs when it runs: `kb --help` and `kb stats` do not pay for the
# interchange formats, the score rule, job records or rich (bench/startup_bench.py measures it).
if TYPE_CHECKING:
    from rich.console import Console

    from kb_mcp.kb.interchange import TransferReport
    from kb_mcp.kb.store import KBStore


class CommandError(Exception):
    """A mistake on the command line (the caller's): printed as one line, exit status 1."""


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `kb` command group."""
    p = sub.add_parser("kb", help="create, inspect, browse, export, import and merge KB files")
    kb_sub = p.add_subparsers(dest="kb_command", metavar="ACTION", required=True)

    s = kb_sub.add_parser("init", help="create and seed the KB file if it does not exist",
                          description="Creates and seeds the KB (private to you: files 0600, folders 0700). "
                          "Serving or calling a tool creates it too, but only where nothing of a KB is yet.")
    s.add_argument("--group", metavar="NAME", help="share the KB with this group: files 0660, folders 2770 "
                   "(also applies to an existing KB)")
    s.set_defaults(func=_wrap(cmd_init))

    s = kb_sub.add_parser("backup", help="fold the journal into the KB file and keep a backup of it now")
    s.set_defaults(func=_wrap(cmd_backup))

    s = kb_sub.add_parser("restore", help="put a backup in place of the KB file (default: the newest)",
                          description="Restores a backup made at a compaction or by `kb backup`. The newest backup "
                          "plus the journal is the whole KB: restoring it after the KB file was deleted or damaged "
                          "loses nothing. The replaced file (and a journal that does not continue the backup) is "
                          "kept beside the KB.")
    s.add_argument("backup", nargs="?", help="backup file or name (see --list); default: the newest")
    s.add_argument("--list", action="store_true", help="list the backups and exit")
    s.set_defaults(func=_wrap(cmd_restore))

    s = kb_sub.add_parser("repair", help="salvage every valid transaction of a damaged journal into a new KB file",
                          description="Reads the KB file and every journal line that passes its checks, applies "
                          "them in order and writes the result in place of the KB file (the old file and journal "
                          "are kept beside it) or to --output.")
    s.add_argument("--output", metavar="PATH", help="write the repaired KB here and leave the KB untouched")
    s.add_argument("--dry-run", action="store_true", help="report what would be salvaged; write nothing")
    s.set_defaults(func=_wrap(cmd_repair))

    s = kb_sub.add_parser("gc", help="remove old job records, unrecorded candidates' files and worker scratch",
                          description="Removes leftovers by age and size; never anything a KB record points to "
                          "(candidates an outcome or lesson names), unfinished jobs, or a running worker's folder.")
    d = Retention()
    s.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    s.add_argument("--job-days", type=float, default=d.job_days,
                   help=f"finished job records older than this (default {d.job_days:g})")
    s.add_argument("--jobs-kept", type=int, default=d.jobs_kept,
                   help=f"newest finished job records kept (default {d.jobs_kept})")
    s.add_argument("--candidate-days", type=float, default=d.candidate_days,
                   help="files of candidates the KB does not need, older than this (default "
                        f"{d.candidate_days:g})")
    s.add_argument("--scratch-hours", type=float, default=d.scratch_hours,
                   help=f"files in a running worker's scratch folder older than this (default {d.scratch_hours:g})")
    s.add_argument("--cache-days", type=float, default=d.cache_days,
                   help=f"build-cache entries unused for this long (default {d.cache_days:g})")
    s.add_argument("--cache-max-mb", type=float, default=None, help="then the oldest cache entries beyond this total")
    s.set_defaults(func=_wrap(cmd_gc))

    s = kb_sub.add_parser("stats", help="counts of states, optimizations, scores and outcomes")
    s.add_argument("--json", action="store_true", help="print the statistics as JSON (as kb://stats)")
    s.set_defaults(func=_wrap(cmd_stats))

    s = kb_sub.add_parser("show", help="one state and its optimizations, best expected speedup first")
    s.add_argument("state", help="state id (see `kb-mcp kb stats` / kb://states)")
    s.add_argument("--arch", help="GPU arch for per-arch scores (sm_90, 9.0, hopper); default pooled")
    s.add_argument("--limit", type=int, default=30, help="rows to show (default 30)")
    s.set_defaults(func=_wrap(cmd_show))

    s = kb_sub.add_parser("export", help="write the KB to another file")
    s.add_argument("path", help="destination file")
    s.add_argument("--format", choices=("kb-mcp", "reference"), default="kb-mcp",
                   help="kb-mcp (full KB, default) or reference (the method's reference-implementation JSON)")
    s.add_argument("--force", action="store_true", help="overwrite an existing destination")
    s.set_defaults(func=_wrap(cmd_export))

    s = kb_sub.add_parser("import", help="import a kb-mcp KB file (pooled) or a reference-implementation KB JSON")
    s.add_argument("path")
    s.set_defaults(func=_wrap(cmd_import))

    s = kb_sub.add_parser("merge", help="pool the statistics of one or more kb-mcp KB files into this KB")
    s.add_argument("paths", nargs="+", metavar="PATH")
    s.set_defaults(func=_wrap(cmd_merge))

    from kb_mcp.server import cmd_browse  # states, candidates, candidate, outcomes, campaigns

    cmd_browse.register(kb_sub)


def _wrap(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from kb_mcp.kb.errors import KbMcpError

        try:
            return fn(args)
        except KbMcpError as exc:
            print(f"kb-mcp kb: error: {exc}", file=sys.stderr)
            return exit_status.of(exc)
        except CommandError as exc:
            print(f"kb-mcp kb: error: {exc}", file=sys.stderr)
            return exit_status.CALLER
        except Exception as exc:
            from kb_mcp.kb.arch import ArchError
            from kb_mcp.kb.interchange import InterchangeError

            if not isinstance(exc, (InterchangeError, ArchError)):
                raise
            print(f"kb-mcp kb: error: {exc}", file=sys.stderr)  # a file or argument given on the command line
            return exit_status.CALLER

    return run


def _console() -> Console:
    from kb_mcp.server import stdout

    return stdout.console(150, soft_wrap=False)


def _open(args: argparse.Namespace, *, create: bool = False) -> KBStore:
    from kb_mcp.kb.store import KBStore

    return KBStore.open(paths.resolve_kb_path(args.kb), create=create)


def cmd_init(args: argparse.Namespace) -> int:
    """Creates and seeds the KB if missing (optionally shared with a group); reports what is there."""
    from kb_mcp.kb import lifecycle

    console = _console()
    path = paths.resolve_kb_path(args.kb)
    report = lifecycle.init_kb(path, group=args.group)
    stats = report.store.stats()
    verb = "created and seeded" if report.created else "already exists"
    console.print(
        f"KB {path} {verb}: {sum(stats.states.values())} states, {sum(stats.optimizations.values())} optimizations, "
        f"{stats.scores} scores, {sum(stats.outcomes.values())} outcomes."
    )
    for note in report.notes:
        console.print(note)
    return exit_status.OK


def cmd_backup(args: argparse.Namespace) -> int:
    """Compacts and keeps a backup now."""
    from kb_mcp.kb import backups

    console = _console()
    store = _open(args)
    dest = store.backup()
    console.print(f"backup of {store.path} kept at {dest} ({len(backups.list_backups(store.path))} kept; "
                  f"${backups.ENV_BACKUPS} sets how many, default {backups.DEFAULT_KEEP})")
    return exit_status.OK


def cmd_restore(args: argparse.Namespace) -> int:
    """Lists backups, or restores one."""
    from kb_mcp.kb import backups, lifecycle

    console = _console()
    path = paths.resolve_kb_path(args.kb)
    if args.list:
        found = backups.list_backups(path)
        if not found:
            console.print(f"no backups of {path} in {paths.backups_dir(path)}")
        for b in found:
            console.print(lifecycle.describe_backup(b))
        return exit_status.OK
    report = lifecycle.restore_kb(path, Path(args.backup).expanduser() if args.backup else None)
    console.print(f"restored {path} from {report.backup} (transaction {report.applied_seq})"
                  + ("; its journal continues that backup and was kept: nothing was lost" if report.journal_kept
                     else "; the journal did not continue that backup: the KB is now what the backup holds"))
    for kept in report.set_aside:
        console.print(f"  kept the replaced file as {kept}")
    return exit_status.OK


def cmd_repair(args: argparse.Namespace) -> int:
    """Salvages a damaged journal."""
    from kb_mcp.kb import lifecycle

    console = _console()
    path = paths.resolve_kb_path(args.kb)
    output = Path(args.output).expanduser().resolve() if args.output else None
    r = lifecycle.repair_kb(path, output=output, dry_run=args.dry_run)
    span = f" ({r.first_seq}..{r.last_seq})" if r.first_seq is not None else ""
    verb = "would salvage" if r.dry_run else "salvaged"
    console.print(f"{path}: {verb} {r.transactions} journal transaction(s){span}; "
                  f"{r.skipped_duplicates} already in the file or written twice")
    for line in r.bad_lines:
        console.print(f"  left out damaged {line}")
    for gap in r.gaps:
        console.print(f"  {gap}")
    if r.torn_tail_bytes:
        console.print(f"  an incomplete last line ({r.torn_tail_bytes} bytes, a write cut short) was dropped")
    if not r.dry_run:
        console.print(f"wrote {r.output}" + ("" if output else "; the KB now reads it, with an empty journal"))
        for kept in r.set_aside:
            console.print(f"  kept the old file as {kept}")
    if not r.damaged:
        console.print("no damage found")
    return exit_status.OK


def cmd_gc(args: argparse.Namespace) -> int:
    """Removes leftovers past retention."""
    from kb_mcp.server import gc

    console = _console()
    store = _open(args)
    limits = Retention(job_days=args.job_days, jobs_kept=args.jobs_kept, candidate_days=args.candidate_days,
                       scratch_hours=args.scratch_hours, cache_days=args.cache_days, cache_max_mb=args.cache_max_mb)
    ctx = gc.GcScope(store=store, artifacts=paths.artifacts_dir(store.path), cache=paths.cache_dir(), limits=limits)
    report = gc.collect(ctx, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for name, items in report.removed.items():
        size = sum(i.size for i in items)
        console.print(f"{name}: {verb} {len(items)} ({size / 1e6:.1f} MB)")
        for item in items[:5] if args.dry_run else []:
            console.print(f"  {item.path}  ({item.why})")
        if args.dry_run and len(items) > 5:
            console.print(f"  ... and {len(items) - 5} more")
    n, size = report.total()
    console.print(f"total: {verb} {n} ({size / 1e6:.1f} MB); kept {report.kept_referenced} candidate files a KB "
                  "record points to")
    for err in report.errors:
        console.print(f"  could not remove {err}")
    return exit_status.ENVIRONMENT if report.errors else exit_status.OK  # a file it could not remove: the machine's


def cmd_stats(args: argparse.Namespace) -> int:
    """Prints the KB's counts as a table."""
    store = _open(args)
    stats = store.stats()
    if args.json:
        print(json.dumps({"kb_path": str(store.path), "stats": stats.model_dump(mode="json")}, indent=2))
        return exit_status.OK
    from rich.table import Table

    from kb_mcp.kb import backups

    console = _console()
    table = Table(title=f"KB {store.path}", show_header=True)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_column("detail")

    def detail(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(d.items()))

    table.add_row("states", str(sum(stats.states.values())), detail(stats.states))
    table.add_row("optimizations", str(sum(stats.optimizations.values())), detail(stats.optimizations))
    table.add_row("scores", str(stats.scores),
                  f"measured {stats.measured_scores}; arch families {', '.join(stats.arch_families)}")
    table.add_row("outcomes", str(sum(stats.outcomes.values())),
                  detail(stats.outcomes) + (f"; flagged {stats.flagged_outcomes}" if stats.flagged_outcomes else ""))
    table.add_row("lessons", str(stats.lessons), "")
    table.add_row("transitions", str(stats.transitions), "counted state-to-state moves")
    table.add_row("candidates", str(stats.candidates), "verdicts stored by compile_and_verify"
                  + (f"; {stats.candidates_removed} more removed under the per-client bound"
                     if stats.candidates_removed else ""))
    table.add_row("schema version", str(stats.schema_version), "")
    waiting = store.pending_count()
    if waiting:
        table.add_row("pending", str(waiting),
                      f"verdicts persisted in {store.pending_dir}, committed with the next write")
    kept = backups.list_backups(store.path)
    table.add_row("backups", str(len(kept)), f"newest {kept[0].path.name}" if kept else "kept at each compaction")
    table.add_row("lock", "", store.lock.probe())
    console.print(table)
    return exit_status.OK


def cmd_show(args: argparse.Namespace) -> int:
    """Prints one state and its optimizations ranked by expected speedup."""
    from rich.table import Table

    from kb_mcp.kb.arch import arch_family
    from kb_mcp.kb.models import ALL_ARCH

    console = _console()
    store = _open(args)
    family = arch_family(args.arch)
    with store.read() as view:
        state = view.get_state(args.state)
        if state is None:
            close = difflib.get_close_matches(args.state, view.state_ids(), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise CommandError(f"no state {args.state!r} in {store.path}{hint}")
        rows = sorted(view.candidates(state.id, family), key=lambda s: s.expected_speedup, reverse=True)
        names = {s.optimization_id: view.get_optimization(s.optimization_id) for s in rows}
        lessons = {s.optimization_id: len(view.lessons(state.id, s.optimization_id)) for s in rows}
        moves = view.transitions(state.id)[:5]
    console.print(f"[bold]{state.id}[/bold] - {state.name}  ({state.signature.key}, {state.origin})")
    console.print(state.description)
    if state.signature.ranges:
        console.print(
            "signature: " + ", ".join(
                f"{r.metric} {'>= ' + format(r.min, 'g') if r.min is not None else ''}"
                f"{' and ' if r.min is not None and r.max is not None else ''}"
                f"{'<= ' + format(r.max, 'g') if r.max is not None else ''}"
                for r in state.signature.ranges
            )
        )
    table = Table(title=f"optimizations (scores: {'pooled' if family == ALL_ARCH else family + ', else pooled'})")
    for col, just in (("id", "left"), ("name", "left"), ("category", "left"), ("expect", "right"), ("conf", "right"),
                      ("n", "right"), ("tries", "right"), ("fails", "right"), ("lessons", "right"), ("arch", "left")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for s in rows[: args.limit]:
        opt = names.get(s.optimization_id)
        table.add_row(
            s.optimization_id, opt.name if opt else "?", opt.category if opt else "", f"x{s.expected_speedup:.2f}",
            f"{s.confidence:.2f}", str(s.samples), str(s.attempts), str(s.compile_failures + s.verify_failures),
            str(lessons[s.optimization_id]), s.arch,
        )
    console.print(table)
    if len(rows) > args.limit:
        console.print(f"... {len(rows) - args.limit} more (--limit)")
    if moves:
        moved = "; ".join(f"{m.optimization_id} -> {m.next_state_id} ({m.count})" for m in moves)
        console.print("most frequent transitions: " + moved)
    return exit_status.OK


def cmd_export(args: argparse.Namespace) -> int:
    """Writes the KB to a file, as a kb-mcp KB or in the reference shape."""
    from kb_mcp.kb.interchange import DestinationExists, export_destination, export_kb, write_export
    from kb_mcp.kb.reference_kb import export_reference

    console = _console()
    store = _open(args)
    try:
        if args.format == "kb-mcp":
            dest = export_kb(store, Path(args.path), overwrite=args.force)
        else:
            dest = export_destination(store, Path(args.path), overwrite=args.force)
            with store.read() as view:
                data = export_reference(view)
            write_export(dest, json.dumps(data, indent=1) + "\n")
    except DestinationExists as exc:
        raise CommandError(f"{exc.path}: exists; choose a new file name, or pass --force to overwrite it") from exc
    console.print(f"exported {store.path} to {dest} ({args.format})")
    return exit_status.OK


def _transfer(store: KBStore, path: Path) -> TransferReport:
    from kb_mcp.kb.interchange import detect_format, merge_kb, read_json
    from kb_mcp.kb.reference_kb import import_reference
    from kb_mcp.policy import update as score_rule

    src = Path(path).expanduser().resolve()
    if src == store.path.resolve():
        raise CommandError(f"{src}: that is this KB itself")
    data = read_json(src)
    fmt = detect_format(data)
    if fmt == "reference":
        return import_reference(store, data, source=str(src))
    if fmt == "kb-mcp":
        del data  # merge reads the file through the store machinery (its journal included)
        return merge_kb(store, src, score_rule)
    raise CommandError(
        f"{src}: neither a kb-mcp KB file nor a reference KB (no 'meta' table, no 'optimization_strategies')"
    )


def _print_report(console: Console, r: TransferReport) -> None:
    console.print(
        f"{r.source} ({r.format}): +{r.states_added} states, +{r.optimizations_added} optimizations, "
        f"+{r.scores_added} scores, {r.scores_pooled} scores pooled, +{r.outcomes_added} outcomes "
        f"({r.outcomes_shared} already here, counted once; {r.outcomes_left_out} left out: their candidate's "
        f"credit is held by another outcome), +{r.lessons_added} lessons, "
        f"+{r.transitions_added} transitions, +{r.candidates_added} candidate verdicts"
    )
    for line in r.ignored[:10]:
        console.print(f"  not carried over: {line}")
    if len(r.ignored) > 10:
        console.print(f"  ... and {len(r.ignored) - 10} more notes")


def cmd_import(args: argparse.Namespace) -> int:
    """Imports one file (format detected)."""
    console = _console()
    store = _open(args, create=True)
    _print_report(console, _transfer(store, args.path))
    return exit_status.OK


def cmd_merge(args: argparse.Namespace) -> int:
    """Merges several files in turn."""
    console = _console()
    store = _open(args, create=True)
    for p in args.paths:
        _print_report(console, _transfer(store, p))
    return exit_status.OK
