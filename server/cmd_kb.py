"""`kb-mcp kb`: create, inspect, export, import and merge Knowledge Base files."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kb_mcp.kb import paths
from kb_mcp.kb.arch import ArchError, arch_family
from kb_mcp.kb.interchange import (
    InterchangeError,
    TransferReport,
    detect_format,
    export_kb,
    export_reference,
    import_reference,
    merge_kb,
    read_json,
)
from kb_mcp.kb.models import ALL_ARCH
from kb_mcp.kb.store import KBFileError, KBStore
from kb_mcp.policy import update as score_rule


class CommandError(Exception):
    """A user error: printed as one line, exit status 1."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds the `kb` command group."""
    p = sub.add_parser("kb", help="create, inspect, export, import and merge KB files")
    kb_sub = p.add_subparsers(dest="kb_command", metavar="ACTION", required=True)

    s = kb_sub.add_parser("init", help="create and seed the KB file if it does not exist")
    s.set_defaults(func=_wrap(cmd_init))

    s = kb_sub.add_parser("stats", help="counts of states, optimizations, scores and outcomes")
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


def _wrap(fn: Callable[[argparse.Namespace, Console], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        # piped output gets a wide fixed width, so tables are not squeezed to 80 columns
        console = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 150)
        try:
            return fn(args, console)
        except (CommandError, KBFileError, InterchangeError, ArchError) as exc:
            print(f"kb-mcp kb: error: {exc}", file=sys.stderr)
            return 1

    return run


def _open(args: argparse.Namespace, *, create: bool = False) -> KBStore:
    path = paths.resolve_kb_path(args.kb)
    if not create and not path.exists():
        raise CommandError(f"no KB at {path}; create one with `kb-mcp --kb {path} kb init` (or pass --kb)")
    return KBStore.open(path)


def cmd_init(args: argparse.Namespace, console: Console) -> int:
    """Creates and seeds the KB if missing; reports what is there."""
    path = paths.resolve_kb_path(args.kb)
    existed = path.exists() and path.stat().st_size > 0
    store = KBStore.open(path)
    stats = store.stats()
    verb = "already exists" if existed else "created and seeded"
    console.print(
        f"KB {path} {verb}: {sum(stats.states.values())} states, {sum(stats.optimizations.values())} optimizations, "
        f"{stats.scores} scores, {sum(stats.outcomes.values())} outcomes."
    )
    return 0


def cmd_stats(args: argparse.Namespace, console: Console) -> int:
    """Prints the KB's counts as a table."""
    store = _open(args)
    stats = store.stats()
    table = Table(title=f"KB {store.path}", show_header=True)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_column("detail")

    def detail(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(d.items()))

    table.add_row("states", str(sum(stats.states.values())), detail(stats.states))
    table.add_row("optimizations", str(sum(stats.optimizations.values())), detail(stats.optimizations))
    table.add_row("scores", str(stats.scores), f"measured {stats.measured_scores}; arch families {', '.join(stats.arch_families)}")
    table.add_row("outcomes", str(sum(stats.outcomes.values())), detail(stats.outcomes) + (f"; flagged {stats.flagged_outcomes}" if stats.flagged_outcomes else ""))
    table.add_row("lessons", str(stats.lessons), "")
    table.add_row("transitions", str(stats.transitions), "counted state-to-state moves")
    table.add_row("candidates", str(stats.candidates), "verdicts stored by compile_and_verify")
    table.add_row("schema version", str(stats.schema_version), "")
    console.print(table)
    return 0


def cmd_show(args: argparse.Namespace, console: Console) -> int:
    """Prints one state and its optimizations ranked by expected speedup."""
    store = _open(args)
    family = arch_family(args.arch)
    with store.read() as view:
        state = view.get_state(args.state)
        if state is None:
            close = difflib.get_close_matches(args.state, view.state_ids(), n=3)
            raise CommandError(f"no state {args.state!r} in {store.path}" + (f"; did you mean {', '.join(close)}?" if close else ""))
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
        console.print("most frequent transitions: " + "; ".join(f"{m.optimization_id} -> {m.next_state_id} ({m.count})" for m in moves))
    return 0


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    """Writes the KB to a file, as a kb-mcp KB or in the reference shape."""
    store = _open(args)
    dest = Path(args.path).expanduser().resolve()
    if args.format == "kb-mcp":
        export_kb(store, dest, overwrite=args.force)
    else:
        if dest.exists() and not args.force:
            raise CommandError(f"{dest}: exists; choose a new file name or pass --force")
        with store.read() as view:
            data = export_reference(view)
        dest.write_text(json.dumps(data, indent=1) + "\n")
    console.print(f"exported {store.path} to {dest} ({args.format})")
    return 0


def _transfer(store: KBStore, path: Path) -> TransferReport:
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
    raise CommandError(f"{src}: neither a kb-mcp KB file nor a reference KB (no 'meta' table, no 'optimization_strategies')")


def _print_report(console: Console, r: TransferReport) -> None:
    console.print(
        f"{r.source} ({r.format}): +{r.states_added} states, +{r.optimizations_added} optimizations, "
        f"+{r.scores_added} scores, {r.scores_pooled} scores pooled, +{r.outcomes_added} outcomes "
        f"({r.outcomes_shared} already here, counted once), +{r.lessons_added} lessons, "
        f"+{r.transitions_added} transitions, +{r.candidates_added} candidate verdicts"
    )
    for line in r.ignored[:10]:
        console.print(f"  not carried over: {line}")
    if len(r.ignored) > 10:
        console.print(f"  ... and {len(r.ignored) - 10} more notes")


def cmd_import(args: argparse.Namespace, console: Console) -> int:
    """Imports one file (format detected)."""
    store = _open(args, create=True)
    _print_report(console, _transfer(store, args.path))
    return 0


def cmd_merge(args: argparse.Namespace, console: Console) -> int:
    """Merges several files in turn."""
    store = _open(args, create=True)
    for p in args.paths:
        _print_report(console, _transfer(store, p))
    return 0
