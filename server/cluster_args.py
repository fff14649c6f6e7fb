"""`--gpus N|all` and `--cluster ADDRESS` for `kb-mcp eval` and `kb-mcp run-campaign`: the flags, the
plan they ask for (`campaign.cluster_models.plan_cluster`), and the cluster opened from it.

Nothing here imports Dask until a cluster is asked for: `--gpus 1`, or neither flag, is today's
single-GPU path. Dask is the optional extra `kernel-kb-mcp[cluster]`; where it is missing, the
message says how to install it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kb_mcp.campaign.cluster import Cluster
    from kb_mcp.campaign.cluster_models import ClusterPlan

INSTALL = "pip install 'kernel-kb-mcp[cluster]'"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds `--gpus` and `--cluster` to a command's parser."""
    g = p.add_argument_group("several GPUs or hosts (Dask; the extra kernel-kb-mcp[cluster])")
    g.add_argument("--gpus", metavar="N|all",
                   help="verify on N GPUs of this machine (or all), one Dask worker each; 1, the default, starts "
                        "no cluster. Without a GPU, --gpus N --compile-only compiles on N CPU workers")
    g.add_argument("--cluster", metavar="ADDRESS",
                   help="verify on the workers of a running Dask scheduler (tcp://host:8786), started on each "
                        "host with `kb-mcp worker ADDRESS`")


def plan_from(args: argparse.Namespace, compile_only: bool) -> ClusterPlan | None:
    """The cluster the flags ask for, None for the single-GPU path; raises ClusterPlanError."""
    from kb_mcp.campaign.cluster_models import plan_cluster
    from kb_mcp.server.gpu import detect_gpus

    if args.gpus is None and not args.cluster:
        return None
    return plan_cluster(args.gpus, args.cluster, gpus_found=len(detect_gpus()), compile_only=compile_only)


@contextmanager
def opened(plan: ClusterPlan | None, private: list[Path]) -> Iterator[Cluster | None]:
    """The cluster of `plan`, started (or joined) for the block and closed after it; None for no plan.
    Raises ClusterPlanError where Dask is not installed."""
    if plan is None:
        yield None
        return
    from kb_mcp.campaign.cluster_models import ClusterPlanError

    try:
        from kb_mcp.campaign.cluster import Cluster
    except ImportError as exc:
        raise ClusterPlanError(f"--gpus and --cluster need Dask distributed ({exc}); install it with `{INSTALL}`, "
                               "or leave both out to verify on one GPU", whose="environment") from exc
    with Cluster(plan, private) as cluster:
        yield cluster
