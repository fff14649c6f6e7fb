"""`kb-mcp run-campaign`: the autonomous MAIC-RL loop over a set of problems, resumable.

    kb-mcp run-campaign examples/problems --llm-base-url http://localhost:8000/v1 --llm-model MODEL
    kb-mcp run-campaign --name overnight            # rerun: continues where it stopped
    kb-mcp run-campaign --name overnight --report   # rebuild the report from the raw records
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kb_mcp.campaign.names import DEFAULT_CAMPAIGN_NAME, CampaignError, campaign_folder
from kb_mcp.clients.llm import LLMConfig, LLMNotConfigured, Role
from kb_mcp.kb import paths
from kb_mcp.server import cluster_args, exit_status

if TYPE_CHECKING:
    from kb_mcp.campaign.runner import CampaignOptions

DEFAULT_NAME = DEFAULT_CAMPAIGN_NAME


def campaign_dir(kb_path: Path, name: str | None, out: str | None) -> Path:
    """The campaign folder: `--out` (the operator's own folder), else `<kb artifacts>/campaigns/<name>`
    by the campaign-name rule (`campaign.store.campaign_folder`; CampaignError for a bad name)."""
    if out:
        return Path(out).expanduser().resolve()
    return campaign_folder(kb_path, name or DEFAULT_NAME)


def _role_models(pairs: list[str]) -> dict[str, str]:
    models: dict[str, str] = {}
    roles = {r.value for r in Role}
    for pair in pairs:
        role, sep, model = pair.partition("=")
        if not sep or role not in roles or not model:
            raise CampaignError(f"--llm-model-for expects ROLE=MODEL with ROLE one of {', '.join(sorted(roles))}; "
                                f"got {pair!r}", whose="usage")
        models[role] = model
    return models


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `run-campaign` command."""
    p = sub.add_parser(
        "run-campaign",
        help="optimize a set of problems autonomously with an LLM (resumable)",
        description=(
            "Run the MAIC-RL campaign: for each problem generate a CUDA kernel, then iterations x steps of "
            "profile -> classify -> select (weighted top-k from the KB) -> lower -> verify -> review -> record, "
            "with a textual-gradient KB update every U outcomes. Rerunning with the same --name/--out resumes."
        ),
    )
    p.add_argument("problems", nargs="*", help="problem files (KernelBench format), folders of them, or a KernelBench "
                   "checkout; omit to resume the named campaign")
    p.add_argument("--level", type=int, help="KernelBench level to take from a checkout (default: every level found)")
    p.add_argument("--problems", dest="problem_ids", metavar="IDS",
                   help="KernelBench problem ids and ranges to take, e.g. 1-20,40")
    p.add_argument("--name",
                   help=f"campaign name: its folder is <kb artifacts>/campaigns/NAME (default {DEFAULT_NAME})")
    p.add_argument("--out", help="campaign folder (overrides --name)")
    p.add_argument("--iterations", type=int, help="trajectories per problem (default 10)")
    p.add_argument("--steps", type=int, help="rollout steps per trajectory (default 10)")
    p.add_argument("--parallel", type=int,
                   help="trajectories at once (default: 1, or the cluster's GPUs with --gpus/--cluster)")
    p.add_argument("--top-k", type=int, help="optimizations sampled per step (default 4)")
    p.add_argument("--temperature", type=float,
                   help="spread of the draw from the KB's posterior: 1 = posterior sampling, 0 = greedy (default 0.5)")
    p.add_argument("--fix-attempts", type=int, help="candidates per lowering step, fixes included (default 3)")
    p.add_argument("--generate-attempts", type=int, help="candidates for the first kernel (default 4)")
    p.add_argument("--gradient-every", type=int,
                   help="textual-gradient KB update every U outcomes; 0 = off (default 8)")
    p.add_argument("--no-review", action="store_true", help="skip the LLM review before accepting a result")
    p.add_argument("--compile-only", action="store_true", help="no GPU: compile with error feedback, record, no timing")
    p.add_argument("--seed", type=int, help="selection seed (default 0)")
    p.add_argument("--arch", help="GPU arch for KB scores (default: what the harness reports)")
    p.add_argument("--track", choices=("fp32", "tf32", "bf16", "fp16"),
                   help="precision track the candidates are verified and scored in "
                        "(default fp32; a campaign keeps its track)")
    p.add_argument("--report", action="store_true", help="only rebuild the report of an existing campaign")
    p.add_argument("--model", action="store_true",
                   help="each problem is a model: decompose it, optimize its parts by share while Amdahl allows "
                        "--target, compose and verify the whole in composed mode (docs/campaigns.md)")
    p.add_argument("--target", type=float, default=1.6, help="with --model: the model speedup aimed at (default 1.6)")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of progress bars")
    cluster_args.add_arguments(p)
    g = p.add_argument_group("LLM (any OpenAI-compatible endpoint; flags override KB_MCP_LLM_* variables)")
    g.add_argument("--llm-base-url", help="e.g. http://localhost:8000/v1 (default: $KB_MCP_LLM_BASE_URL, else OpenAI)")
    g.add_argument("--llm-api-key", help="key (default: $KB_MCP_LLM_API_KEY)")
    g.add_argument("--llm-model", help="model for every role (default: $KB_MCP_LLM_MODEL)")
    g.add_argument("--llm-model-for", action="append", default=[], metavar="ROLE=MODEL",
                   help=f"model for one role ({', '.join(r.value for r in Role)}); repeatable")
    g.add_argument("--llm-timeout", type=float, help="seconds per request (default 300)")
    g.add_argument("--llm-max-retries", type=int, help="retries on errors and timeouts (default 3)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Runs (or resumes, or reports on) a campaign; returns the exit code."""
    from kb_mcp.campaign.cluster_models import ClusterError
    from kb_mcp.campaign.loop import CampaignAborted
    from kb_mcp.campaign.runner import campaign_report, run_campaign

    kb_path = paths.resolve_kb_path(args.kb)
    try:
        folder = campaign_dir(kb_path, args.name, args.out)
    except CampaignError as exc:
        print(f"kb-mcp run-campaign: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    if args.report:
        try:
            written = campaign_report(folder)
        except CampaignError as exc:
            print(f"kb-mcp run-campaign: {exc}", file=sys.stderr)
            return exit_status.of(exc)
        except OSError as exc:  # a record gone from the folder, permissions, a full disk: the machine's
            from kb_mcp.kb.errors import storage_error

            print(f"kb-mcp run-campaign: {storage_error(exc, 'rebuild the report in', folder)}", file=sys.stderr)
            return exit_status.ENVIRONMENT
        print("\n".join(str(p) for p in written))
        return exit_status.OK
    try:
        options = _options(args)
        llm = LLMConfig.from_env(
            base_url=args.llm_base_url,
            api_key=args.llm_api_key,
            model=args.llm_model,
            role_models=_role_models(args.llm_model_for) or None,
            timeout_s=args.llm_timeout,
            max_retries=args.llm_max_retries,
        ).require()
    except CampaignError as exc:
        print(f"kb-mcp run-campaign: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    except LLMNotConfigured as exc:  # no endpoint or model given, or a flag's (a KB_MCP_LLM_ variable's) value unusable
        print(f"kb-mcp run-campaign: {exc}", file=sys.stderr)
        return exit_status.USAGE
    if args.model:
        return _run_models(args, kb_path, folder, options, llm)
    from kb_mcp.server.campaign_console import ConsoleProgress
    from kb_mcp.tools.context import ToolContext

    try:
        plan = cluster_args.plan_from(args, bool(args.compile_only))
    except CampaignError as exc:
        print(f"kb-mcp run-campaign: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    with ConsoleProgress(enabled=not args.no_progress) as console:
        try:
            with cluster_args.opened(plan, ToolContext(kb_path).private_places) as cluster:
                if plan is not None and cluster is not None:
                    console.log(f"verifying on {plan.describe()}: {cluster.capacity} at once")
                result = run_campaign(folder, kb_path, options, llm, progress=console.update, log=console.log,
                                      cluster=cluster)
        except CampaignAborted:
            console.log(f"interrupted; every finished step is saved. Rerun the same command to resume ({folder}).")
            sys.stderr.flush()
            # Rollout threads may still be inside an LLM call or a verification; every record is
            # written atomically, so nothing needs them to finish: leave without waiting.
            os._exit(exit_status.INTERRUPTED)
        except KeyboardInterrupt:
            console.log(f"interrupted; every finished step is saved. Rerun the same command to resume ({folder}).")
            return exit_status.INTERRUPTED
        except CampaignError as exc:
            console.log(f"kb-mcp run-campaign: {exc}")
            return exit_status.of(exc)
        except ClusterError as exc:
            console.log(f"kb-mcp run-campaign: {exc}")
            return exit_status.ENVIRONMENT
    print(result.summary)
    # a run that did not finish was stopped by its LLM endpoint failing past every retry: the machine's
    return exit_status.OK if result.finished else exit_status.ENVIRONMENT


def _options(args: argparse.Namespace) -> CampaignOptions:
    """The campaign's options, from the command line; CampaignError names the flag CampaignOptions
    refuses (the model holds each option's range, the flags only carry it)."""
    from pydantic import ValidationError

    from kb_mcp.campaign.runner import CampaignOptions

    try:
        return CampaignOptions(
            problems=list(args.problems), iterations=args.iterations, steps=args.steps, parallel=args.parallel,
            top_k=args.top_k, temperature=args.temperature, fix_attempts=args.fix_attempts,
            generate_attempts=args.generate_attempts, gradient_every=args.gradient_every,
            review=False if args.no_review else None, compile_only=True if args.compile_only else None,
            seed=args.seed, arch=args.arch, track=args.track, level=args.level, problem_ids=args.problem_ids,
        )
    except ValidationError as exc:
        refused = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else "options"
            flag = _FLAGS.get(field, "--" + field.replace("_", "-"))
            refused.append(f"{flag} {err.get('input')!r}: {err['msg'].lower()}")
        raise CampaignError("; ".join(refused), whose="usage") from exc


_FLAGS = {"problem_ids": "--problems", "problems": "PROBLEMS", "review": "--no-review"}  # fields named otherwise


def _run_models(args: argparse.Namespace, kb_path: Path, folder: Path, options: CampaignOptions,
                llm: LLMConfig) -> int:
    """`--model`: a campaign per model (`campaign.model_campaign`), each in its own folder under `folder`."""
    from kb_mcp.campaign.model_campaign import run_model_campaign
    from kb_mcp.kb.errors import ToolError

    models = [Path(p) for p in args.problems]
    if not models or not all(m.is_file() for m in models):
        print("kb-mcp run-campaign: --model takes model problem files", file=sys.stderr)
        # none given: the command line's; a path that is no file: the caller's
        return exit_status.CALLER if models else exit_status.USAGE
    for model in models:
        try:
            record = run_model_campaign(folder / model.stem, kb_path, model,
                                        options.model_copy(update={"problems": []}), llm, target=args.target)
        except ToolError as exc:
            print(f"kb-mcp run-campaign: {model}: {exc}", file=sys.stderr)
            return exit_status.of(exc)
        print(f"{record.problem}: {len(record.parts)} parts optimized ({record.stopped}); composed candidate "
              f"{record.candidate_id}: {record.verdict}" + (f", {record.speedup:.2f}x" if record.speedup else ""))
    return exit_status.OK
