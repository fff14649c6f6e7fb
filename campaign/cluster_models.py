"""The plain parts of spreading verifications over a cluster: which workers (the one place that reads
`--gpus N|all` and `--cluster ADDRESS`, names the resource a verification takes, and decides each
local worker's device), the messages between the coordinator and a worker, and the errors.

Plain Python, no Dask: `--gpus 1` (the default) decides here that no cluster is needed, and the
caller then runs today's single-GPU path without importing anything of Dask. Where a cluster is
needed, `campaign.cluster` starts or joins it from the `ClusterPlan` made here.

Every worker offers one `GPU_RESOURCE` and runs one verification at a time: a GPU worker is pinned to
its device (`CUDA_VISIBLE_DEVICES`), and a CPU worker (a machine without a GPU, compile-only checks;
what CI runs) offers the same one slot, so verifications are scheduled the same way on both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.campaign.store import CampaignError
from kb_mcp.harness.baselines import BaselineRun
from kb_mcp.harness.judgment.verdict import VerifyOptions, VerifyResult
from kb_mcp.harness.problem import Problem

__all__ = [
    "ALLOWED_FAILURES", "RERUNS", "GPU_RESOURCE", "BaselinesJob", "ClusterError", "ClusterPlan", "ClusterPlanError",
    "RemoteAnswer", "RemoteBaselines", "RemoteVerdict", "THREAD_VARIABLES", "VerifyJob", "WorkerSpec",
    "local_workers", "parse_gpus", "plan_cluster", "thread_share", "visible_devices",
]

GPU_RESOURCE = "GPU"
"""The Dask worker resource a verification takes one of: each worker offers exactly one."""

ALLOWED_FAILURES = 2
"""How many times a verification may lose its worker (killed, out of memory, its GPU lost) and be
re-run on another before it is given up (Dask's `allowed-failures`)."""

RERUNS = 4
"""How many times a task is sent again after a worker answered that its harness could not run (the
worker withdrawn, or its lost harness process replaced) before the task is given up."""


class ClusterPlanError(CampaignError):
    """`--gpus` or `--cluster` cannot be met as given (the caller's or this machine's: the message says)."""


class ClusterError(RuntimeError):
    """A verification sent to the cluster came back without a result (its workers kept dying, or the
    harness could not start on a worker); the message says whose it is and what to do."""


class WorkerSpec(BaseModel):
    """One local worker of the cluster: its name and the device it is pinned to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    device: str | None = Field(None, description="CUDA_VISIBLE_DEVICES of the worker; None for a CPU worker")
    environ: dict[str, str] = Field(default_factory=dict, description="more of the worker's environment")

    @property
    def env(self) -> dict[str, str]:
        """The worker process's environment beside the coordinator's: its one visible GPU, and `environ`."""
        return {**self.environ, **({} if self.device is None else {"CUDA_VISIBLE_DEVICES": self.device})}

    @property
    def resources(self) -> dict[str, float]:
        """What it offers the scheduler: one verification at a time."""
        return {GPU_RESOURCE: 1}


class ClusterPlan(BaseModel):
    """Where the verifications run: the local workers to start, or the running scheduler to join."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: list[WorkerSpec] = Field(default_factory=list, description="local workers to start (none to join)")
    address: str | None = Field(None, description="a running Dask scheduler (`--cluster`)")
    processes: bool = Field(True, description="each local worker a process of its own (threads only for tests)")
    allowed_failures: int = ALLOWED_FAILURES

    def describe(self) -> str:
        """One line for the log."""
        if self.address:
            return f"the Dask cluster at {self.address}"
        kinds = {"GPU" if w.device is not None else "CPU" for w in self.workers}
        devices = ", ".join(w.device for w in self.workers if w.device is not None)
        return (f"a local Dask cluster of {len(self.workers)} {'/'.join(sorted(kinds))} worker(s)"
                + (f" (devices {devices})" if devices else ""))


def parse_gpus(text: str | int | None) -> int | None:
    """`--gpus`: a count >= 1, or `all` (None: every visible GPU). Raises ClusterPlanError otherwise."""
    if text is None or isinstance(text, int):
        count = text
    elif text.strip().lower() == "all":
        return None
    else:
        try:
            count = int(text)
        except ValueError:
            raise ClusterPlanError(f"--gpus takes a number of GPUs or 'all', not {text!r}", whose="usage") from None
    if count is not None and count < 1:
        raise ClusterPlanError(f"--gpus takes 1 or more (or 'all'), not {count}", whose="usage")
    return count


def visible_devices(gpus_found: int, environ: dict[str, str] | None = None) -> list[str]:
    """The devices this process may hand out, one per worker: the entries of CUDA_VISIBLE_DEVICES
    where it is set (the user's own restriction holds), else nvidia-smi's indices 0..n-1; none
    where nvidia-smi found no GPU."""
    if gpus_found == 0:
        return []
    env = os.environ if environ is None else environ
    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [d.strip() for d in given.split(",") if d.strip()]
    return [str(i) for i in range(gpus_found)]


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def thread_share(workers: int, cpus: int | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each of `workers` local workers' share of the host's `cpus` cores for the host threads of torch
    and its math libraries, as environment variables; one the user set is kept as set. Dask's nanny
    would give every worker one thread (`distributed.nanny.pre-spawn-environ`, switched off by
    `cluster._no_nanny_defaults`), running the harness's host work (a large problem's weights made on
    the host, its pristine copies) serially; unset, every worker would take every core."""
    env = os.environ if environ is None else environ
    share = str(max(1, (cpus if cpus is not None else os.cpu_count() or 1) // max(1, workers)))
    return {name: env.get(name, share) for name in THREAD_VARIABLES}


def local_workers(count: int | None, devices: list[str], *, compile_only: bool,
                  environ: Mapping[str, str] | None = None, cpu_option: str = "--compile-only") -> list[WorkerSpec]:
    """One worker per GPU (the first `count` of `devices`, or all of them); on a machine without a
    GPU, `count` CPU workers for compile-only checks; each with its share of the cores (`thread_share`,
    `environ` the user's environment). Raises ClusterPlanError where that cannot be, naming
    `cpu_option`, the command's own flag for CPU workers (eval's and run-campaign's `--compile-only`,
    the worker's `--cpu-workers N`)."""
    if devices:
        if count is not None and count > len(devices):
            raise ClusterPlanError(f"--gpus {count} asks for more GPUs than this machine lets this process see "
                                   f"({len(devices)}: {', '.join(devices)}); ask for {len(devices)} or 'all'",
                                   whose="environment")
        chosen = devices if count is None else devices[:count]
        threads = thread_share(len(chosen), environ=environ)
        return [WorkerSpec(name=f"gpu-{d}", device=d, environ=threads) for d in chosen]
    if not compile_only:
        raise ClusterPlanError("--gpus needs CUDA GPUs to verify and time on, and this machine shows none; "
                               f"add {cpu_option} to compile on CPU workers, or run on a GPU machine",
                               whose="environment")
    if count is None:
        raise ClusterPlanError("--gpus all found no GPU on this machine; give a number of CPU workers "
                               "(--gpus N --compile-only) instead", whose="environment")
    threads = thread_share(count, environ=environ)
    return [WorkerSpec(name=f"cpu-{i}", environ=threads) for i in range(count)]


def plan_cluster(gpus: str | int | None, address: str | None, *, gpus_found: int, compile_only: bool,
                 environ: dict[str, str] | None = None) -> ClusterPlan | None:
    """The cluster `--gpus` and `--cluster` ask for, or None for today's path (one GPU, no cluster):
    `--gpus 1` or neither flag given, or `--gpus all` on a machine of one GPU."""
    if address:
        if gpus is not None:
            raise ClusterPlanError("--cluster uses the workers of a running scheduler; --gpus starts local ones: "
                                   "give one of them", whose="usage")
        return ClusterPlan(address=address)
    if gpus is None:
        return None
    count = parse_gpus(gpus)
    devices = visible_devices(gpus_found, environ)
    if count == 1 or (count is None and len(devices) == 1):
        return None
    return ClusterPlan(workers=local_workers(count, devices, compile_only=compile_only, environ=environ))


class VerifyJob(BaseModel):
    """One verification, as it travels to a worker: everything it needs, nothing it must look up."""

    model_config = ConfigDict(extra="forbid")

    problem: Problem
    candidate: str
    options: VerifyOptions


class RemoteAnswer(BaseModel):
    """What every answer of a worker says besides its result: who gave it, and where the harness
    could not run there, why and whether the worker must be withdrawn (its harness cannot start: the
    task is sent to another) or only asked again (a harness process lost and already replaced)."""

    model_config = ConfigDict(extra="forbid")

    error: str | None = Field(None, description="the harness could not run on that worker (the environment's)")
    broken: bool = Field(False, description="its harness cannot start (or its GPU is gone): withdraw the worker")
    worker: str
    address: str = Field("", description="the Dask worker's address (to withdraw it)")
    host: str
    pid: int
    seconds: float = Field(description="the task's time on the worker")

    @property
    def where(self) -> str:
        """`worker on host (pid N)`: which worker answered."""
        return f"{self.worker} on {self.host} (pid {self.pid})"


class RemoteVerdict(RemoteAnswer):
    """A worker's answer to a `VerifyJob`: the harness's result (None where `error` says why)."""

    result: VerifyResult | None = None


class BaselinesJob(BaseModel):
    """One problem's baselines (eager and torch.compile, no candidate), as they travel to a worker."""

    model_config = ConfigDict(extra="forbid")

    problem: Problem
    options: VerifyOptions


class RemoteBaselines(RemoteAnswer):
    """A worker's answer to a `BaselinesJob`: the harness's run (None where `error` says why)."""

    run: BaselineRun | None = None
