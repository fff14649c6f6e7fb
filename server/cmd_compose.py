"""`kb-mcp compose PROBLEM --parts DIR`: the whole-model candidate written from the parts' verified
candidates (each part's best standard verdict in the KB, the reference part where none) as
DIR/composed.py, then verified end to end by compile_and_verify in composed mode (docs/models.md).
DIR is a decomposition `kb-mcp decompose` wrote (made there first where there is none, under the same
--timeout); a DIR that holds the decomposition of another problem is refused, not overwritten. Progress
goes to stderr."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kb_mcp.server import exit_status
from kb_mcp.server.cmd_decompose import add_timeout, say


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `compose` command."""
    p = sub.add_parser("compose", help="compose a model's candidate from its parts' verified candidates and verify it",
                       description=__doc__)
    p.add_argument("problem", help="the model's problem file (KernelBench format)")
    p.add_argument("--parts", metavar="DIR", required=True, help="the decomposition's folder (kb-mcp decompose --out)")
    p.add_argument("--no-verify", action="store_true", help="only write DIR/composed.py")
    add_timeout(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Composes and verifies; prints the picks and the verdict. 1 when the model cannot be decomposed."""
    from kb_mcp.kb import paths
    from kb_mcp.tools import decompose_problem
    from kb_mcp.tools.base import ToolError
    from kb_mcp.tools.context import ToolContext

    ctx = ToolContext(paths.resolve_kb_path(args.kb), client_name="kb-mcp compose")
    req = decompose_problem.Request(problem=args.problem, compose=True, verify=not args.no_verify,
                                    timeout_s=args.timeout)
    said = say("compose")

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        if message:
            said(message)

    try:  # the operator's own folder: not confined to the KB's folder for decompositions, as an MCP caller's is
        result = decompose_problem.run_in(ctx, req, Path(args.parts).expanduser().resolve(), progress)
    except ToolError as exc:
        print(f"kb-mcp compose: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    finally:
        ctx.close()
    own = [p for p in result.picks if p.taken == "candidate"]
    print(f"{result.problem}: {len(own)} of {result.parts_total} parts run candidates of their own; "
          f"written to {result.composed_file}")
    for pick in sorted(own, key=lambda p: -p.share):
        print(f"  {100 * pick.share:5.1f} %  {pick.part}  {pick.label}: {pick.candidate_id or 'given'} "
              f"({pick.verdict or 'unverified'})")
    if result.verification is not None:
        rec = result.verification.record
        print(f"  composed candidate {rec.candidate_id}: {rec.verdict.value} (mode {rec.mode}"
              + (f", coverage {100 * rec.coverage:.0f} %" if rec.coverage is not None else "") + ")")
    return exit_status.OK
