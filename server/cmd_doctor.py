"""`kb-mcp doctor`: one screen of checks of this machine, each failure with its fix.

Exit status: 0 when nothing failed (warnings limit what works but do not fail), 3 (the machine's to
fix) when a check failed, so scripts can gate on it; `--gpu` makes everything GPU work needs a requirement.
"""

from __future__ import annotations

import argparse

from kb_mcp.server.doctor import run_checks
from kb_mcp.server.doctor_model import Check, Report, Status

MARKS = {Status.ok: "[green]ok[/green]", Status.info: "[blue]--[/blue]", Status.warn: "[yellow]warn[/yellow]",
         Status.fail: "[bold red]FAIL[/bold red]"}


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `doctor` command."""
    p = sub.add_parser(
        "doctor",
        help="check this machine (GPU, driver, torch, nvcc, ncu, sandbox, KB) and say how to fix what fails",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1] + " " + __doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument("--json", action="store_true", help="print the checks as JSON (same exit status)")
    p.add_argument("--gpu", action="store_true",
                   help="require a working GPU setup (GPU, CUDA build of torch, nvcc, ncu with counters): missing "
                        "parts fail")
    p.set_defaults(func=run)


def render(report: Report) -> None:
    """The checks as a table on stdout, fixes under the lines that need them."""
    from rich.table import Table

    from kb_mcp.server import stdout

    console = stdout.console(120)
    table = Table(title=f"kb-mcp doctor{' (--gpu)' if report.require_gpu else ''}", title_justify="left",
                  show_header=False, box=None, padding=(0, 1))
    table.add_column(width=4)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for check in report.checks:
        table.add_row(MARKS[check.status], check.name, _escape(check.summary))
        if check.fix and check.status in (Status.warn, Status.fail):
            table.add_row("", "", f"[dim]fix:[/dim] {_escape(check.fix)}")
    console.print(table)
    failed = [c.name for c in report.checks if c.status == Status.fail]
    warned = [c.name for c in report.checks if c.status == Status.warn]
    if failed:
        console.print(f"[bold red]{len(failed)} check(s) failed[/bold red]: {', '.join(failed)}")
    elif warned:
        console.print(f"ready, with limits: {', '.join(warned)} (see the fixes above)")
    else:
        console.print("[green]all checks passed[/green]")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def run(args: argparse.Namespace) -> int:
    """Runs the checks, prints them, and returns 0, or the environment's status when a check failed."""
    report = run_checks(args.kb, require_gpu=args.gpu)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        render(report)
    return report.exit_code


__all__ = ["Check", "register", "render", "run"]
