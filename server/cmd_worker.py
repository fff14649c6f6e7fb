"""`kb-mcp worker ADDRESS`: this host's GPUs as Dask workers of a running scheduler, for
`kb-mcp eval --cluster ADDRESS` and `kb-mcp run-campaign --cluster ADDRESS` (docs/cluster.md).

    dask scheduler --port 8786                      # on one host
    kb-mcp worker tcp://head:8786                   # on each GPU host: one worker per GPU
    kb-mcp worker tcp://head:8786 --cpu-workers 2   # no GPU: compile-only checks on 2 workers

Each worker is a process of its own pinned to one GPU, offering one verification at a time, with a
warm harness pool for its whole life; it reads and writes no KB (the coordinator stores every
verdict), and its sandbox hides this host's own KB too.
"""

from __future__ import annotations

import argparse
import sys

from kb_mcp.server import exit_status


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `worker` command."""
    p = sub.add_parser(
        "worker",
        help="serve this host's GPUs to a Dask scheduler, for eval and run-campaign --cluster",
        description=(
            "Start one Dask worker per GPU of this host (each its own process, pinned to its GPU with "
            "CUDA_VISIBLE_DEVICES, offering the resource GPU=1) for the scheduler at ADDRESS, and serve until "
            "interrupted. Needs the extra kernel-kb-mcp[cluster]."
        ),
    )
    p.add_argument("address", metavar="ADDRESS", help="the Dask scheduler, e.g. tcp://head-node:8786")
    p.add_argument("--gpus", metavar="N|all", default="all", help="GPUs of this host to serve (default all)")
    p.add_argument("--cpu-workers", type=int, metavar="N",
                   help="on a host without a GPU: N CPU workers for compile-only checks")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serves until interrupted; the usage status for unusable arguments, the environment's for a
    machine that cannot serve them (no GPU, Dask not installed)."""
    from kb_mcp.campaign.cluster_models import ClusterPlanError, local_workers, parse_gpus, visible_devices
    from kb_mcp.kb import paths
    from kb_mcp.server.cluster_args import INSTALL
    from kb_mcp.server.gpu import detect_gpus

    kb = paths.resolve_kb_path(args.kb)
    try:
        if args.cpu_workers is not None:
            if args.cpu_workers < 1:
                raise ClusterPlanError("--cpu-workers takes 1 or more", whose="usage")
            specs = local_workers(args.cpu_workers, [], compile_only=True)
        else:
            specs = local_workers(parse_gpus(args.gpus), visible_devices(len(detect_gpus())), compile_only=False,
                                  cpu_option="--cpu-workers N")
    except ClusterPlanError as exc:
        print(f"kb-mcp worker: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    try:
        from kb_mcp.campaign.cluster import serve_workers
    except ImportError as exc:
        print(f"kb-mcp worker: needs Dask distributed ({exc}); install it with `{INSTALL}`", file=sys.stderr)
        return exit_status.ENVIRONMENT
    print(f"kb-mcp worker: {len(specs)} worker(s) for {args.address}: "
          + ", ".join(s.name for s in specs), file=sys.stderr, flush=True)
    try:
        serve_workers(args.address, specs, [kb.parent, paths.artifacts_dir(kb)])
    except KeyboardInterrupt:  # how a worker is stopped: not a failure
        return exit_status.OK
    return exit_status.OK
