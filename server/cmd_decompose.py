"""`kb-mcp decompose PROBLEM [--out DIR]`: a model split into parts worth one kernel each (docs/models.md).

The problem is traced in the sandbox at its real sizes without allocating them, its ops grouped
into parts, each written as a KernelBench-format problem under DIR/parts/, ranked by its estimated
share of the model's GPU time; DIR/composed_reference.py is the model recomposed from the reference's
own parts (the file `kb-mcp compose` starts from), DIR/decomposition.json the record of it all.
A decomposition of the same source in DIR is reused; a DIR that holds the decomposition of another
problem is refused, not overwritten. The problem's own code may run --timeout seconds in each step
(the trace, the split) before it is stopped; progress goes to stderr."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from kb_mcp.decomposition.limits import TIME_LIMIT_S, time_limit
from kb_mcp.server import exit_status


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `decompose` command."""
    p = sub.add_parser("decompose", help="split a model (a level-3 problem) into parts worth one kernel each",
                       description=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    p.add_argument("problem", help="the problem file (KernelBench format: Model, get_inputs, get_init_inputs)")
    p.add_argument("--out", metavar="DIR", help="where to write the parts (default: ./<problem>-parts)")
    p.add_argument("--top", type=int, default=10, help="how many parts to list, largest share first (default 10)")
    add_timeout(p)
    p.set_defaults(func=run)


def add_timeout(p: argparse.ArgumentParser) -> None:
    """Adds `--timeout SECONDS`: how long the problem's own code may run while it is decomposed."""
    p.add_argument("--timeout", type=_seconds, default=TIME_LIMIT_S, metavar="SECONDS",
                   help="stop the problem's own code (its Model's construction or forward) after this many seconds "
                   f"in each step of the decomposition, the trace and the split (default {TIME_LIMIT_S:g})")


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    try:
        return time_limit(seconds)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def say(command: str) -> Callable[[str], None]:
    """What a command says as it goes: a line on stderr each (stdout holds its result)."""
    return lambda message: print(f"kb-mcp {command}: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Decomposes the problem (or reuses its decomposition in DIR) and prints the ranking; the caller's
    status (1) when there is no problem file, it is not a problem or its code fails, or DIR holds
    another problem's decomposition; kb-mcp's status (4) for a model the decomposition cannot split
    faithfully (the message says what in the model to change to get around it)."""
    from kb_mcp.kb.errors import KbMcpError
    from kb_mcp.tools.decompose_problem import decomposed
    from kb_mcp.tools.source import read_problem

    path = Path(args.problem)
    if not path.is_file():
        print(f"kb-mcp decompose: no problem file at {path}", file=sys.stderr)
        return exit_status.CALLER
    out = Path(args.out) if args.out else Path.cwd() / f"{path.stem}-parts"
    try:
        # the checks every tool makes of a problem first (UTF-8, Python, a Model and its inputs), then
        # the decomposition the tool would make or reuse in `out`
        decomp = decomposed(read_problem(str(path), None), out.expanduser().resolve(),  # the operator's own file
                            timeout_s=args.timeout, say=say("decompose"))
    except KbMcpError as exc:  # the problem's to fix (a ToolError), or ours: `whose` picks the status
        print(f"kb-mcp decompose: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    ranked = decomp.by_file()
    shared = f" in {len(ranked)} files" if len(ranked) < len(decomp.parts) else ""
    print(f"{path.stem}: {len(decomp.parts)} parts{shared} ({decomp.method} trace on {decomp.built_on} tensors), "
          f"written to {out}")
    for note in decomp.failures:
        print(f"  traced by {decomp.method} after: {note}")
    print(f"  share of the model's GPU time ({decomp.share_basis} from FLOPs and bytes on an H200's peaks):")
    for part, share, others in ranked[: args.top]:
        runs = f", run by {len(others) + 1} parts" if others else ""
        print(f"  {100 * share:5.1f} %  {part.name}  {part.kind:<10} {part.label}  ({part.file}{runs})")
    layers = decomp.by_layer()
    if layers:
        print("  layers that run in several files (their places differ, e.g. in the piece of an input they take):")
    for heads, share, places in layers[: args.top]:
        names = ", ".join(h.name for h in heads[:3]) + (f" and {len(heads) - 3} more" if len(heads) > 3 else "")
        print(f"  {100 * share:5.1f} %  {heads[0].kind:<10} {heads[0].label}  at {places} places in {len(heads)} "
              f"files ({names})")
    return exit_status.OK
