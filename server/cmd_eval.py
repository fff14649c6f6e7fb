"""`kb-mcp eval`: verify a folder of solutions against a KernelBench tree (or any folder of problems)
through the harness, without an LLM, and write the campaign report.

    kb-mcp eval ~/KernelBench --level 1 --problems 1-20,40 --solutions runs/mine
    kb-mcp eval tests/campaign/problems --solutions my_kernels --compile-only
    kb-mcp eval ~/KernelBench --baselines          # eager and torch.compile of every problem (no solutions)
    kb-mcp eval ~/KernelBench --level 2 --solutions runs/mine --build-jobs 0   # serial: no builds ahead
    kb-mcp eval ~/KernelBench --level 1 --solutions runs/mine --gpus all       # one Dask worker per GPU
    kb-mcp eval ~/KernelBench --level 1 --baselines --gpus all                 # the table, N problems at once
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kb_mcp.campaign.names import CampaignError, eval_folder
from kb_mcp.kb import paths
from kb_mcp.server import cluster_args, exit_status

DEFAULT_NAME = "eval"
TRACKS = ("fp32", "tf32", "bf16", "fp16")  # kb.models.Track's values (kept literal: start-up stays light)


def eval_dir(kb_path: Path, name: str | None, out: str | None) -> Path:
    """The eval's folder: `--out`, else `<kb artifacts>/evals/<name>` by the campaign-name rule
    (`campaign.names.eval_folder`; CampaignError for a name that would leave that folder)."""
    if out:
        return Path(out).expanduser().resolve()
    return eval_folder(kb_path, name or DEFAULT_NAME)


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `eval` command."""
    p = sub.add_parser(
        "eval",
        help="verify solution files against KernelBench problems through the harness (no LLM)",
        description=(
            "Match a solution file to each selected problem by name (the problem's file name, or KernelBench's "
            "level_<L>_problem_<N>_sample_<S>_kernel.py), verify and time each through compile_and_verify, and write "
            "the campaign report: speedup over eager, over torch.compile and over the better of the two, valid rate, "
            "geomean, fast_p. While one solution verifies on the GPU, the next ones' load_inline extensions are built "
            "ahead on the CPU cores; progress shows the ETA. Rerunning with the same --name/--out skips solutions "
            "already evaluated."
        ),
    )
    p.add_argument("problems", nargs="+", metavar="PROBLEMS",
                   help="a KernelBench checkout, a level folder, a folder of problem files, or problem files")
    p.add_argument("--solutions", metavar="DIR", help="folder of solution files (ModelNew), matched by name")
    p.add_argument("--level", type=int, help="KernelBench level to take (default: every level found)")
    p.add_argument("--problems", dest="ids", metavar="IDS", help="problem ids and ranges, e.g. 1-20,40")
    p.add_argument("--track", choices=TRACKS, default="fp32", help="precision track to verify in (default fp32)")
    p.add_argument("--mode", choices=("own", "composed"),
                   help="own: only the solution's own kernels compute; composed: it may keep the PyTorch ops the "
                        "reference runs beside one kernel of its own (default: composed for level 3, own otherwise)")
    p.add_argument("--name", help="eval name (a letter or digit first, then letters, digits, '_', '.', '-'): its "
                   f"folder is <kb artifacts>/evals/NAME (default {DEFAULT_NAME})")
    p.add_argument("--out", help="eval folder (overrides --name)")
    p.add_argument("--compile-only", action="store_true", help="no GPU: compile each solution, time nothing")
    p.add_argument("--baselines", action="store_true",
                   help="time eager and torch.compile of every selected problem on this GPU into <folder>/"
                        "baselines.json (also what an eval given no --solutions does); a rerun skips problems done")
    p.add_argument("--build-jobs", type=int, metavar="N",
                   help="solutions built ahead at once while the GPU verifies (0: none, one after another; "
                        "default: what the CPU cores and memory hold)")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of progress bars")
    cluster_args.add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Runs the eval; exit status 0 when every matched solution was evaluated, else the refusal's
    (`exit_status`: the caller's inputs, the command line, the machine)."""
    from pydantic import ValidationError

    from kb_mcp.campaign.cluster_models import ClusterError
    from kb_mcp.campaign.eval_models import EvalError, EvalOptions
    from kb_mcp.campaign.evaluate import evaluate
    from kb_mcp.kb.models import Track
    from kb_mcp.server.campaign_console import ConsoleProgress
    from kb_mcp.server.gpu import detect_gpus
    from kb_mcp.tools.context import ToolContext

    kb_path = paths.resolve_kb_path(args.kb)
    try:
        folder = eval_dir(kb_path, args.name, args.out)
    except CampaignError as exc:  # a --name no eval could use
        print(f"kb-mcp eval: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    if args.build_jobs is not None and args.build_jobs < 0:
        print("kb-mcp eval: --build-jobs takes 0 (no builds ahead) or more", file=sys.stderr)
        return exit_status.USAGE
    if args.baselines or args.solutions is None:
        return run_baselines(args, kb_path, folder)
    try:
        options = EvalOptions(problems=list(args.problems), solutions=args.solutions, level=args.level, ids=args.ids,
                              track=Track(args.track), mode=args.mode, compile_only=args.compile_only,
                              build_jobs=args.build_jobs)
    except ValidationError as exc:  # e.g. --level 0, --build-jobs 1000: an option no eval could use
        flags = {"ids": "--problems", "problems": "PROBLEMS"}  # fields named otherwise on the command line
        refused = "; ".join(f"{flags.get(str(e['loc'][0]), '--' + str(e['loc'][0]).replace('_', '-'))} "
                            f"{e.get('input')!r}: {e['msg'].lower()}" for e in exc.errors() if e["loc"])
        print(f"kb-mcp eval: {refused}", file=sys.stderr)
        return exit_status.USAGE
    ctx = ToolContext(kb_path, client_name="kb-mcp eval")
    try:
        plan = cluster_args.plan_from(args, args.compile_only)
        with ConsoleProgress(enabled=not args.no_progress) as console, \
                cluster_args.opened(plan, ctx.private_places) as cluster:
            if plan is not None and cluster is not None:
                console.log(f"verifying on {plan.describe()}: {cluster.capacity} at once")
            result = evaluate(folder, ctx, options, have_gpu=bool(detect_gpus()), progress=console.update,
                              log=console.log, cluster=cluster)
    except (EvalError, CampaignError) as exc:
        print(f"kb-mcp eval: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    except ClusterError as exc:
        print(f"kb-mcp eval: {exc}", file=sys.stderr)
        return exit_status.ENVIRONMENT
    except KeyboardInterrupt:
        print(f"interrupted; every finished problem is saved. Rerun the same command to continue ({folder}).",
              file=sys.stderr)
        return exit_status.INTERRUPTED
    finally:
        ctx.close()
    print(summary(result))
    return exit_status.OK


def run_baselines(args: argparse.Namespace, kb_path: Path, folder: Path) -> int:
    """`--baselines` (or no --solutions): the table of eager and torch.compile times, resumable; on the
    workers of a cluster with `--gpus N` or `--cluster` (the GPUs are theirs: this process needs none
    with `--cluster`)."""
    from kb_mcp.campaign.baselines_eval import BaselinesError, baselines_table
    from kb_mcp.campaign.cluster_models import ClusterError
    from kb_mcp.campaign.selection import SelectionError, select_problems
    from kb_mcp.kb.models import Track
    from kb_mcp.server.campaign_console import ConsoleProgress
    from kb_mcp.server.gpu import detect_gpus
    from kb_mcp.tools.context import ToolContext

    try:  # the caller's mistakes first, whatever the machine
        select_problems([*args.problems], level=args.level, ids=args.ids)
    except SelectionError as exc:
        print(f"kb-mcp eval: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    if args.compile_only or (not args.cluster and not detect_gpus()):
        print("kb-mcp eval: timing baselines needs a CUDA GPU, and there is none here"
              + (" (--compile-only)" if args.compile_only else "") + "; give --solutions to compile solutions "
              "without one", file=sys.stderr)
        # --compile-only asked for no GPU: the command line's; a machine without one: the machine's
        return exit_status.USAGE if args.compile_only else exit_status.ENVIRONMENT
    out = folder / "baselines.json"
    ctx = ToolContext(kb_path, client_name="kb-mcp eval")
    try:
        plan = cluster_args.plan_from(args, compile_only=False)
        with ConsoleProgress(enabled=not args.no_progress) as console, \
                cluster_args.opened(plan, ctx.private_places) as cluster:
            if plan is not None and cluster is not None:
                console.log(f"timing baselines on {plan.describe()}: {cluster.capacity} at once")
            rows = baselines_table(out, ctx, [*args.problems], level=args.level, ids=args.ids,
                                   track=Track(args.track), progress=console.update, log=console.log,
                                   cluster=cluster)
    except (BaselinesError, CampaignError) as exc:
        print(f"kb-mcp eval: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    except ClusterError as exc:
        print(f"kb-mcp eval: {exc}", file=sys.stderr)
        return exit_status.ENVIRONMENT
    except KeyboardInterrupt:
        print(f"interrupted; every finished problem is in {out}. Rerun the same command to continue.", file=sys.stderr)
        return exit_status.INTERRUPTED
    finally:
        ctx.close()
    print(baselines_summary(rows, out))
    return exit_status.OK


def baselines_summary(rows: list, out: Path) -> str:
    """Counts by status, and the table's path."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    text = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return f"{len(rows)} problems: {text}\ntable: {out}"


def summary(result: object) -> str:
    """The per-problem table and the headline numbers, for the terminal."""
    from kb_mcp.campaign.eval_models import EvalResult

    assert isinstance(result, EvalResult)
    rows = [f"{'problem':<44} {'verdict':<14} {'speedup':>8}  note"]
    for line in result.lines:
        speed = f"{line.speedup:.2f}x" if line.speedup else "-"
        rows.append(f"{line.problem[:44]:<44} {(line.verdict.value if line.verdict else '-'):<14} {speed:>8}  "
                    f"{line.note}")
    report = result.report
    s = report.speedup
    rows.append("")
    rows.append(f"{len(report.problems)} problems, track {report.config.track.value}, "
                f"{report.verification_modes() or 'no verification mode'}, {report.run_label()}: "
                f"valid rate {report.valid_rate:.0%}")
    if s.n:
        rows.append(f"speedup over the better of eager and torch.compile: geomean {s.geomean:.2f}x, "
                    f"median {s.median:.2f}x (n={s.n}); fast_1 {report.fast_p.get('1', 0):.0%}")
    rows += report.notes
    rows.append(f"report: {result.report_md}")
    return "\n".join(rows)
