"""The cluster's plain parts: what `--gpus` and `--cluster` ask for, each worker's device, and that the
single-GPU path decides all this without importing Dask."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kb_mcp.campaign.cluster_models import (
    GPU_RESOURCE,
    ClusterPlanError,
    local_workers,
    parse_gpus,
    plan_cluster,
    visible_devices,
)


def test_one_gpu_or_no_flag_is_no_cluster() -> None:
    assert plan_cluster(None, None, gpus_found=4, compile_only=False) is None
    assert plan_cluster("1", None, gpus_found=4, compile_only=False) is None
    assert plan_cluster("all", None, gpus_found=1, compile_only=False, environ={}) is None


def test_each_gpu_worker_is_pinned_to_its_own_device() -> None:
    plan = plan_cluster("all", None, gpus_found=4, compile_only=False, environ={})
    assert plan is not None
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in plan.workers] == [str(i) for i in range(4)]
    assert all(w.resources == {GPU_RESOURCE: 1} for w in plan.workers)
    two = plan_cluster("2", None, gpus_found=4, compile_only=False, environ={})
    assert two is not None and [w.device for w in two.workers] == ["0", "1"]


def test_the_users_own_device_list_holds() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2, 3"}
    assert visible_devices(4, env) == ["2", "3"]
    plan = plan_cluster("all", None, gpus_found=4, compile_only=False, environ=env)
    assert plan is not None and [w.device for w in plan.workers] == ["2", "3"]
    assert "devices 2, 3" in plan.describe()
    assert visible_devices(0, env) == []  # nvidia-smi found none: the variable names nothing there is


def test_cpu_workers_only_for_compile_only_checks() -> None:
    plan = plan_cluster("2", None, gpus_found=0, compile_only=True)
    assert plan is not None and [w.name for w in plan.workers] == ["cpu-0", "cpu-1"]
    assert all(w.device is None and "CUDA_VISIBLE_DEVICES" not in w.env and w.resources == {GPU_RESOURCE: 1}
               for w in plan.workers)
    with pytest.raises(ClusterPlanError, match="shows none; add --compile-only to compile on CPU workers"):
        plan_cluster("2", None, gpus_found=0, compile_only=False)
    with pytest.raises(ClusterPlanError, match="found no GPU"):
        plan_cluster("all", None, gpus_found=0, compile_only=True)


@pytest.mark.parametrize(("gpus", "message"), [("0", "1 or more"), ("two", "a number of GPUs or 'all'"),
                                                ("8", "more GPUs than this machine")])
def test_unusable_gpu_counts_are_the_callers(gpus: str, message: str) -> None:
    with pytest.raises(ClusterPlanError, match=message):
        plan_cluster(gpus, None, gpus_found=2, compile_only=False, environ={})


def test_a_running_scheduler_is_joined_not_started() -> None:
    plan = plan_cluster(None, "tcp://head:8786", gpus_found=0, compile_only=False)
    assert plan is not None and plan.address == "tcp://head:8786" and plan.workers == []
    with pytest.raises(ClusterPlanError, match="give one of them"):
        plan_cluster("2", "tcp://head:8786", gpus_found=2, compile_only=False)
    assert parse_gpus("ALL") is None and parse_gpus(3) == 3
    assert local_workers(None, ["5"], compile_only=False)[0].name == "gpu-5"


def test_the_single_gpu_path_imports_no_dask() -> None:
    """Every module of today's path, and the flags' own decision that no cluster is needed."""
    code = (
        "import sys, argparse\n"
        "import kb_mcp.server.cli, kb_mcp.server.cmd_eval, kb_mcp.server.cmd_campaign, kb_mcp.server.cmd_worker\n"
        "import kb_mcp.campaign.evaluate, kb_mcp.campaign.runner, kb_mcp.campaign.loop, kb_mcp.campaign.bench\n"
        "from kb_mcp.server import cluster_args\n"
        "args = argparse.Namespace(gpus='1', cluster=None)\n"
        "assert cluster_args.plan_from(args, False) is None\n"
        "with cluster_args.opened(None, []) as c: assert c is None\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_worker_spec_adds_its_environment_beside_its_device() -> None:
    from kb_mcp.campaign.cluster_models import WorkerSpec

    spec = WorkerSpec(name="gpu-3", device="3", environ={"OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "9"})
    assert spec.env == {"OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "3"}  # the device is never overridden


def test_each_local_worker_gets_its_share_of_the_cores() -> None:
    from kb_mcp.campaign.cluster_models import THREAD_VARIABLES, thread_share

    assert thread_share(4, cpus=64, environ={}) == dict.fromkeys(THREAD_VARIABLES, "16")
    assert thread_share(3, cpus=2, environ={}) == dict.fromkeys(THREAD_VARIABLES, "1")  # never none
    # a count the user set holds
    assert thread_share(2, cpus=32, environ={"OMP_NUM_THREADS": "6"})["OMP_NUM_THREADS"] == "6"
    share = thread_share(2)["MKL_NUM_THREADS"]  # this machine's (or the user's) share, as checked above
    for spec in [*local_workers(None, ["0", "1"], compile_only=False), *local_workers(2, [], compile_only=True)]:
        assert spec.env["MKL_NUM_THREADS"] == share and set(THREAD_VARIABLES) <= set(spec.env), spec
