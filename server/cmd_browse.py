"""`kb-mcp kb states|candidates|candidate|outcomes|campaigns`: browse what the KB holds.

Each command prints a table, or with `--json` the same document the matching MCP resource serves
(kb://states, kb://candidates, kb://candidate/{id}, kb://outcomes, kb://campaigns), built by the
same function in `server/kb_views.py`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from kb_mcp.kb import paths
from kb_mcp.kb.models import Verdict
from kb_mcp.server import exit_status

if TYPE_CHECKING:  # the views and rich are imported when a browsing command runs, not when `kb` parses
    from pydantic import BaseModel
    from rich.console import Console

    from kb_mcp.kb.store import KBStore

Printer = Callable[["Console", "BaseModel"], None]


class BrowseError(Exception):
    """A browsing request that cannot be answered; printed as one line, exit status 1."""


def register(kb_sub: argparse._SubParsersAction) -> None:
    """Adds the browsing actions to the `kb` command group."""
    s = kb_sub.add_parser("states", help="every state: bottleneck, origin, scored optimizations, outcomes")
    _json(s)
    s.set_defaults(func=_run(_states))

    s = kb_sub.add_parser("candidates", help="verified candidates, newest first: verdict, speedup, device")
    s.add_argument("--problem", help="only this problem (its name, e.g. swish)")
    s.add_argument("--verdict", choices=[v.value for v in Verdict], help="only this verdict")
    s.add_argument("--flagged", action="store_true",
                   help="only candidates held for review, with their findings (a sandbox_attempt: what was tried)")
    s.add_argument("--limit", type=int, default=30, help="rows to show (default 30)")
    _json(s)
    s.set_defaults(func=_run(_candidates))

    s = kb_sub.add_parser("candidate", help="one candidate: its verdict, source and lineage")
    s.add_argument("candidate_id", help="a candidate_id, or a unique prefix of one (see `kb candidates`)")
    s.add_argument("--no-source", action="store_true", help="leave the source out of the screen")
    _json(s)
    s.set_defaults(func=_run(_candidate))

    s = kb_sub.add_parser("outcomes", help="recorded outcomes, newest first: state, optimization, verdict, speedup")
    s.add_argument("--state", help="only outcomes in this state")
    s.add_argument("--problem", help="only outcomes of this problem")
    s.add_argument("--limit", type=int, default=30, help="rows to show (default 30)")
    _json(s)
    s.set_defaults(func=_run(_outcomes))

    s = kb_sub.add_parser("campaigns", help="campaigns kept beside this KB: state, problems, report")
    _json(s)
    s.set_defaults(func=_run(_campaigns))


def _json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (the matching kb:// resource's document)")


def _run(fn: Callable[[argparse.Namespace, KBStore], tuple[BaseModel, Printer]]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from kb_mcp.kb.errors import KbMcpError
        from kb_mcp.kb.store import KBStore

        path = paths.resolve_kb_path(args.kb)
        try:
            # The store says what is wrong with a KB it cannot open (missing, deleted beside its backups,
            # a folder): a listing never creates one, and never advises `kb init` over a lost KB.
            document, printer = fn(args, KBStore.open(path, create=False))
        except BrowseError as exc:
            print(f"kb-mcp kb: error: {exc}", file=sys.stderr)
            return exit_status.CALLER
        except KbMcpError as exc:  # the KB file's state (damaged, locked, unreadable): the operator's to fix
            print(f"kb-mcp kb: error: {exc}", file=sys.stderr)
            return exit_status.of(exc)
        if args.json:
            print(document.model_dump_json(indent=2, exclude_none=True))
        else:
            from kb_mcp.server import stdout

            printer(stdout.console(150, soft_wrap=False), document)
        return exit_status.OK

    return run


def _x(value: float | None) -> str:
    return f"x{value:.2f}" if value is not None else ""


def _states(args: argparse.Namespace, store: KBStore) -> tuple[BaseModel, Printer]:
    from rich.table import Table

    from kb_mcp.server import kb_views

    def show(console: Console, doc: BaseModel) -> None:
        assert isinstance(doc, kb_views.StatesOverview)
        table = Table(title=f"{doc.count} states in {store.path}")
        for col, just in (("id", "left"), ("bottleneck", "left"), ("origin", "left"), ("scored", "right"),
                          ("outcomes", "right")):
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        for s in doc.states:
            table.add_row(s.id, s.bottleneck, s.origin, str(s.scored_optimizations), str(s.outcomes))
        console.print(table)
        console.print(f"one state in full: {kb_command(store, 'kb show STATE')}", markup=False)

    return kb_views.states_overview(store), show


def kb_command(store: KBStore, rest: str) -> str:
    """A command to suggest about this KB: with its `--kb` unless it is the KB a plain command opens."""
    chosen = "" if store.path.resolve() == paths.resolve_kb_path() else f" --kb {store.path}"
    return f"kb-mcp{chosen} {rest}"


def _candidates(args: argparse.Namespace, store: KBStore) -> tuple[BaseModel, Printer]:
    from rich.table import Table

    from kb_mcp.server import kb_views

    def show(console: Console, doc: BaseModel) -> None:
        assert isinstance(doc, kb_views.CandidatesOverview)
        newest = f", newest {len(doc.candidates)}" if doc.count > len(doc.candidates) else ""
        table = Table(title=f"{doc.count} candidate(s) in {store.path}{newest}")
        for col, just in (("candidate_id", "left"), ("problem", "left"), ("mode", "left"), ("verdict", "left"),
                          ("vs baseline", "right"),
                          ("time", "right"), ("device", "left"), ("outcomes", "right"), ("verified", "left")):
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        for c in doc.candidates:
            verdict = c.verdict.value + (" (flagged)" if c.flagged else "")
            mode = "own kernels" if c.mode == "own" else "composed" + (
                f" ({c.coverage:.0%})" if c.coverage is not None else "")
            table.add_row(c.candidate_id, c.problem, mode, verdict, _x(c.speedup_vs_baseline),
                          f"{c.time_ms:.4g} ms" if c.time_ms is not None else "", c.device, str(c.outcomes),
                          c.created_at.strftime("%Y-%m-%d %H:%M"))
        console.print(table)
        for c in doc.candidates if args.flagged else []:
            console.print(f"{c.candidate_id} flagged: {', '.join(c.findings) or 'loosened options'}"
                          + (f"\n  sandbox_attempt: {c.attempt}" if c.attempt else ""), markup=False)
        console.print(f"one candidate with its source and lineage: {kb_command(store, 'kb candidate ID')}",
                      markup=False)

    overview = kb_views.candidates_overview(store, problem=args.problem, verdict=args.verdict, flagged=args.flagged,
                                            limit=args.limit)
    return overview, show


def _candidate(args: argparse.Namespace, store: KBStore) -> tuple[BaseModel, Printer]:
    from rich.markup import escape
    from rich.syntax import Syntax

    from kb_mcp.server import kb_views

    matches = kb_views.resolve_candidate_id(store, args.candidate_id)
    if not matches:
        from kb_mcp.tools.candidate_store import ENV_CANDIDATES_KEPT_PER_CLIENT

        with store.read() as view:
            removed = view.candidates_removed()
        raise BrowseError(f"no candidate {args.candidate_id!r} in {store.path}"
                          + (f" (the verdicts of {removed} candidate(s) were removed under the per-client bound, "
                             f"${ENV_CANDIDATES_KEPT_PER_CLIENT}: a removed one is verified again to be shown)"
                             if removed else "")
                          + f"; `{kb_command(store, 'kb candidates')}` lists them")
    if len(matches) > 1:
        raise BrowseError(f"{args.candidate_id!r} names {len(matches)} candidates ({', '.join(matches[:5])}...); give "
                          "more of the id")
    detail = kb_views.candidate_detail(store, paths.artifacts_dir(store.path) / "candidates", matches[0])
    assert detail is not None

    def show(console: Console, doc: BaseModel) -> None:
        assert isinstance(doc, kb_views.CandidateDetail)
        r = doc.record
        console.print(f"[bold]{r.candidate_id}[/bold]  problem {r.problem}  verdict [bold]{r.verdict.value}[/bold]"
                      + ("  [yellow]flagged for review[/yellow]" if r.flagged else ""))
        timing = ", ".join(p for p in (
            f"{r.time_ms:.4g} ms" if r.time_ms is not None else "",
            f"eager {r.eager_ms:.4g} ms" if r.eager_ms is not None else "",
            f"torch.compile {r.compile_ms:.4g} ms" if r.compile_ms is not None else "",
            f"{_x(r.speedup_vs_baseline)} over the better baseline" if r.speedup_vs_baseline is not None else "",
            f"device {r.device_ms:.4g} ms" + (f" vs eager {r.eager_device_ms:.4g} ms" if r.eager_device_ms else "")
            if r.device_ms is not None else "",
        ) if p)
        where = f"verified {r.created_at:%Y-%m-%d %H:%M} on {r.device or 'no GPU'} {r.arch}".rstrip()
        console.print(where + (f": {timing}" if timing else ""))
        if r.findings:
            console.print("integrity findings: " + ", ".join(r.findings))
        if r.attempt:
            console.print(f"sandbox_attempt: {r.attempt}", markup=False)
        chain = doc.lineage
        if len(chain) > 1 or doc.children:
            lineage = " -> ".join(
                (f"[{s.optimization_id}] " if s.optimization_id else "") + s.candidate_id
                + (f" {_x(s.speedup_vs_baseline)}" if s.speedup_vs_baseline is not None else "")
                for s in chain
            )
            console.print(f"lineage: {escape(lineage)}")
            for child in doc.children:
                console.print(f"  made from it: {child.candidate_id} via {child.optimization_id} "
                              f"({child.verdict.value if child.verdict else '?'}) {_x(child.speedup_vs_baseline)}")
        for o in doc.outcomes:
            console.print(f"outcome: {o.state_id} / {o.optimization_id}: {o.verdict.value} {_x(o.speedup)}"
                          + (f" - {escape(o.analysis[:120])}" if o.analysis else ""))
        if doc.source is None:
            console.print("source: not kept beside this KB")
        elif not args.no_source:
            console.print(f"source ({doc.source_path}):")
            console.print(Syntax(doc.source, "python", line_numbers=True, word_wrap=True))

    return detail, show


def _outcomes(args: argparse.Namespace, store: KBStore) -> tuple[BaseModel, Printer]:
    from rich.markup import escape
    from rich.table import Table

    from kb_mcp.server import kb_views

    def show(console: Console, doc: BaseModel) -> None:
        assert isinstance(doc, kb_views.OutcomesOverview)
        newest = f", newest {len(doc.outcomes)}" if doc.count > len(doc.outcomes) else ""
        table = Table(title=f"{doc.count} outcome(s) in {store.path}{newest}")
        for col, just in (("when", "left"), ("problem", "left"), ("state", "left"), ("optimization", "left"),
                          ("verdict", "left"), ("speedup", "right"), ("vs baseline", "right"), ("candidate", "left"),
                          ("agent", "left")):
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        for o in doc.outcomes:
            table.add_row(o.created_at.strftime("%Y-%m-%d %H:%M"), o.problem, o.state_id, o.optimization_id,
                          o.verdict.value + (" (flagged)" if o.flagged else ""), _x(o.speedup),
                          _x(o.speedup_vs_baseline),
                          o.candidate_id, escape(o.agent))
        console.print(table)

    return kb_views.outcomes_overview(store, state=args.state, problem=args.problem, limit=args.limit), show


def _campaigns(args: argparse.Namespace, store: KBStore) -> tuple[BaseModel, Printer]:
    from rich.markup import escape
    from rich.table import Table

    from kb_mcp.server import kb_views

    def show(console: Console, doc: BaseModel) -> None:
        assert isinstance(doc, kb_views.CampaignsOverview)
        if not doc.campaigns:
            console.print(f"no campaigns beside {store.path} (kb-mcp run-campaign starts one)")
            return
        table = Table(title=f"campaigns beside {store.path}")
        for col in ("name", "state", "problems", "runs", "updated", "report"):
            table.add_column(col)
        for c in doc.campaigns:
            table.add_row(c.name, c.state + (f": {escape(c.message[:60])}" if c.message else ""), str(c.problems),
                          str(c.runs),
                          c.updated_at.strftime("%Y-%m-%d %H:%M") if c.updated_at else "", c.report or "")
        console.print(table)

    return kb_views.campaigns_overview(paths.artifacts_dir(store.path)), show
