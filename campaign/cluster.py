"""Verifications spread over the GPUs of one host or of many, on Dask distributed.

The coordinator (the `kb-mcp eval` or `kb-mcp run-campaign` process) starts a local cluster of one
worker per GPU, or joins a running scheduler (`--cluster`), and sends each verification there as a
task: a `VerifyJob` (the problem's and the candidate's text and the options; no shared file system
is assumed) in, a `RemoteVerdict` (the harness's `VerifyResult`, and which worker gave it) out, both
as JSON. A worker only verifies: the coordinator alone stores verdicts in the KB, through the same
`tools.compile_and_verify.record` the single-GPU path uses. A problem's baselines travel the same way
(`BaselinesJob` in, `RemoteBaselines` out: `kb-mcp eval --baselines --gpus N`), the coordinator
alone writing the table.

Each worker process keeps one warm harness pool (`harness.pool.pool.WorkerPool`) for its whole life
(`HarnessPlugin`), pinned to its GPU by its environment, so its lane is that GPU's
(`harness.gpu.gpu_key`) and its timings never share the GPU with another worker's. A worker offers one
`GPU_RESOURCE` and runs one task at a time; the coordinator keeps at most as many tasks in flight as
the cluster has slots now (workers joining a running scheduler later add theirs), so a task assigned
to a worker is a task running there.

Faults: a worker that dies while verifying (killed, out of memory, its GPU lost) has its task re-run
on another by the scheduler, up to `ALLOWED_FAILURES` times (`allowed-failures`); a task that
returned (whatever the candidate's verdict) is never re-run, since Dask retries nothing else
(`retries=0`). Each re-run is counted from the scheduler's own count of the workers lost under the
task (`TaskState.suspicious`) and kept in `Cluster.retried`, which the reports list.

Only this module (and `kb-mcp worker`) imports Dask; it is imported only where a cluster is asked for.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import dask
from distributed import Client, KilledWorker, Nanny, Scheduler, SpecCluster, Worker, WorkerPlugin, get_worker

from kb_mcp.campaign.cluster_models import (
    GPU_RESOURCE,
    RERUNS,
    BaselinesJob,
    ClusterError,
    ClusterPlan,
    RemoteAnswer,
    RemoteBaselines,
    RemoteVerdict,
    VerifyJob,
    WorkerSpec,
)
from kb_mcp.campaign.models import Retry
from kb_mcp.harness.builds.builds import toolchain
from kb_mcp.harness.pool.pool import WorkerError, WorkerPool
from kb_mcp.harness.problem import candidate_id
from kb_mcp.harness.sandbox.sandbox import SandboxUnavailable, detect
from kb_mcp.kb import paths
from kb_mcp.tools import compile_and_verify
from kb_mcp.tools.context import ToolContext

__all__ = ["Cluster", "HarnessPlugin", "serve_workers", "verify_on"]

log = logging.getLogger(__name__)
QUIET = logging.WARNING  # Dask's own INFO lines (each worker's start and stop) stay out of the progress
START_TIMEOUT_S = 120.0  # for the local workers (a Python start and Dask's import each) or a scheduler's answer
REFRESH_S = 2.0  # how old the count of the cluster's slots may be
WATCH_S = 5.0  # how often a task waited on checks that a worker is left to run it


# -- the worker side ------------------------------------------------------------------------------

_HARNESSES: weakref.WeakKeyDictionary[Worker, WorkerPool] = weakref.WeakKeyDictionary()
_SETTINGS: weakref.WeakKeyDictionary[Worker, tuple[list[Path], bool]] = weakref.WeakKeyDictionary()
_HARNESS_LOCK = threading.Lock()
A = TypeVar("A", bound=RemoteAnswer)


def _private_default() -> list[Path]:
    """What a worker's sandbox hides where nobody said: this host's own default KB and its artifacts."""
    kb = paths.resolve_kb_path(None)
    return [kb.parent, paths.artifacts_dir(kb)]


class HarnessPlugin(WorkerPlugin):
    """Gives each worker its own warm harness pool for its whole life, and stops it with the worker.

    `private` are the places the sandbox hides from candidates besides its defaults (the KB and
    its artifacts; the coordinator's where the worker shares its host). `spare` keeps a spare
    harness worker beside the active one (a GPU worker's instant replacement after a fault).
    """

    name = "kb-mcp-harness"

    def __init__(self, private: Iterable[str | Path] = (), *, spare: bool = True) -> None:
        self.private = [str(p) for p in private]
        self.spare = spare

    def setup(self, worker: Worker) -> None:
        """Makes the worker's pool (its harness processes start with the first verification). Where no
        sandbox can start here, the worker still joins: its first task says so, and it is withdrawn."""
        with _HARNESS_LOCK:
            _SETTINGS[worker] = ([*map(Path, self.private), *_private_default()], self.spare)
        try:
            _harness(worker)
        except WorkerError:
            pass  # said by the first task, which re-runs elsewhere

    def teardown(self, worker: Worker) -> None:
        """Stops the worker's harness processes."""
        with _HARNESS_LOCK:
            pool = _HARNESSES.pop(worker, None)
        if pool is not None:
            pool.close()


def _harness(worker: Worker) -> WorkerPool:
    """The worker's pool; a worker started without `HarnessPlugin` (by dask-jobqueue, say) gets one
    on its first task, hiding this host's default KB. Raises WorkerError where no sandbox can start."""
    with _HARNESS_LOCK:
        pool = _HARNESSES.get(worker)
        if pool is None:
            private, spare = _SETTINGS.get(worker, (_private_default(), True))
            try:
                sandbox = detect().with_private(private)
            except SandboxUnavailable as exc:
                raise WorkerError(f"no sandbox can start here: {exc}") from exc
            pool = _HARNESSES[worker] = WorkerPool(cache_dir=paths.cache_dir(), sandbox=sandbox, spare=spare)
        return pool


def _broken(worker: Worker) -> str | None:
    """Why the worker's harness cannot run now (after it failed a task), or None where it starts again
    (a lost harness process, replaced): no pool, no harness worker, or the GPU it was pinned to gone."""
    try:
        info = _harness(worker).info()
    except WorkerError as exc:
        return f"its harness cannot start ({exc})"
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if pinned and pinned != "-1" and not info.cuda:
        return f"its GPU (CUDA_VISIBLE_DEVICES={pinned}) is gone: the harness sees no CUDA device"
    return None


def _on_harness(model: type[A], work: Callable[[WorkerPool], Any], field: str) -> str:
    """`work` on this worker's pool, its value as `field` of the answer `model` (JSON). Where the
    harness could not run, the answer says why and whether this worker must be withdrawn."""
    worker = get_worker()
    t0 = time.monotonic()
    value, error, broken = None, None, None
    try:
        value = work(_harness(worker))
    except WorkerError as exc:  # the environment's or the harness's, never the candidate's: said as such
        broken = _broken(worker)
        error = (f"the harness could not run on Dask worker {worker.name} ({socket.gethostname()}): {exc}"
                 + (f"; {broken}" if broken and broken not in str(exc) else ""))
    return model(**{field: value}, error=error, broken=broken is not None, worker=str(worker.name),
                 address=worker.address, host=socket.gethostname(), pid=os.getpid(),
                 seconds=round(time.monotonic() - t0, 3)).model_dump_json()


def verify_task(job_json: str) -> str:
    """The task a worker runs: one verification in its own pool; a `RemoteVerdict` as JSON."""
    job = VerifyJob.model_validate_json(job_json)
    return _on_harness(RemoteVerdict, lambda pool: pool.verify(job.problem, job.candidate, job.options), "result")


def baselines_task(job_json: str) -> str:
    """The task a worker runs for `kb-mcp eval --baselines`: one problem's eager and torch.compile timed
    in its own pool (and cached on its host, as a verification's first measurement would be); a
    `RemoteBaselines` as JSON."""
    job = BaselinesJob.model_validate_json(job_json)
    return _on_harness(RemoteBaselines, lambda pool: pool.baselines(job.problem, job.options), "run")


async def _no_slot(dask_worker: Worker) -> None:
    """On a worker: its GPU slot taken away (`GPU=0`), so the scheduler sends it no more tasks."""
    await dask_worker.set_resources(**{GPU_RESOURCE: 0})


def _warm_harness(dask_worker: Worker) -> str:
    """On a worker: its harness pool started and the compilers probed (what its first verification
    would pay); the device it verifies on, and that device's UUID."""
    pool = _harness(dask_worker)
    info = pool.info()
    toolchain(pool.sandbox)
    return f"{info.device or 'no GPU'} {info.uuid or ''}".strip()


def echo_task(payload: str) -> str:
    """A task that does nothing: what scheduling one costs (`bench/scale_bench.py`)."""
    return payload


def _deaths(key: str, dask_scheduler: Scheduler | None = None) -> int:
    """On the scheduler: how many workers died while running the task `key`."""
    assert dask_scheduler is not None
    ts = dask_scheduler.tasks.get(key)
    return int(ts.suspicious) if ts is not None else 0


# -- the coordinator side -------------------------------------------------------------------------

def _no_nanny_defaults() -> None:
    """Dask's nanny sets each worker's OMP, MKL and OpenBLAS threads to 1 and a malloc trim threshold
    (`distributed.nanny.pre-spawn-environ`), and writes them into the process that starts it, the
    coordinator, too: its own later work (the one-GPU path of the same run, the harness workers it
    starts after) would inherit them. Off; each worker's threads come with its spec
    (`cluster_models.thread_share`)."""
    dask.config.set({"distributed.nanny.pre-spawn-environ": {}})


def _worker_options(spec: WorkerSpec, plugin: HarnessPlugin, processes: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"nthreads": 1, "resources": spec.resources, "name": spec.name,
                               "plugins": (plugin,), "host": "127.0.0.1"}
    if processes:  # a thread of this process cannot be pinned to a device of its own
        options.update(env=spec.env, silence_logs=QUIET)
    return {"cls": Nanny if processes else Worker, "options": options}


class Cluster:
    """The coordinator's handle on the workers: `verify(job)` from any thread, at most `capacity`
    at once; `retried` lists what was re-run after a worker died. Use it as a context manager."""

    def __init__(self, plan: ClusterPlan, private: Iterable[str | Path] = ()) -> None:
        self.plan = plan
        self.private = [str(p) for p in private]
        self.retried: list[Retry] = []
        self.withdrawn: dict[str, str] = {}  # workers withdrawn (their harness could not run): why, by name
        self._cluster: SpecCluster | None = None
        self._client: Client | None = None
        self._slots, self._counted = 0, 0.0  # the cluster's slots, and when they were counted
        self._in_flight = 0
        self._turn = threading.Condition()
        self._lock = threading.Lock()
        self._config = dask.config.set({"distributed.scheduler.allowed-failures": plan.allowed_failures})

    def __enter__(self) -> Cluster:
        self._config.__enter__()
        try:
            self._client = self._connect()
            self.client.wait_for_workers(len(self.plan.workers) or 1, timeout=START_TIMEOUT_S)
            if self.capacity < 1:
                raise ClusterError(
                    f"the cluster's workers offer no {GPU_RESOURCE!r} resource, so no verification can be scheduled: "
                    f"start them with `kb-mcp worker ADDRESS` (or `dask worker ADDRESS --resources {GPU_RESOURCE}=1 "
                    "--nthreads 1`)")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def client(self) -> Client:
        """The Dask client (after `__enter__`)."""
        if self._client is None:
            raise RuntimeError("the cluster is not started: use it as a context manager (ours to fix)")
        return self._client

    def _connect(self) -> Client:
        if self.plan.address:
            try:
                return Client(self.plan.address, timeout=START_TIMEOUT_S)
            except OSError as exc:
                raise ClusterError(f"no Dask scheduler answered at {self.plan.address} ({exc}); start one "
                                   "(`dask scheduler`) and its workers (`kb-mcp worker ADDRESS`), or check the "
                                   "address") from exc
        gpu = any(w.device is not None for w in self.plan.workers)
        plugin = HarnessPlugin(self.private, spare=gpu)
        _no_nanny_defaults()
        workers = {w.name: _worker_options(w, plugin, self.plan.processes) for w in self.plan.workers}
        scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard": False,
                                                   "dashboard_address": "127.0.0.1:0",
                                                   "allowed_failures": self.plan.allowed_failures}}
        self._cluster = SpecCluster(workers=workers, scheduler=scheduler, name="kb-mcp", silence_logs=QUIET)
        return Client(self._cluster, timeout=START_TIMEOUT_S)

    @property
    def capacity(self) -> int:
        """The verifications the cluster runs at once: its workers' slots, counted at most `REFRESH_S` ago."""
        with self._lock:
            if time.monotonic() - self._counted > REFRESH_S:
                workers = self.client.scheduler_info(n_workers=-1)["workers"].values()
                self._slots = int(sum(w.get("resources", {}).get(GPU_RESOURCE, 0) for w in workers))
                self._counted = time.monotonic()
            return self._slots

    def worker_pids(self) -> dict[str, int]:
        """Each worker's process id, by its address."""
        return dict(self.client.run(os.getpid))

    def verify(self, job: VerifyJob) -> RemoteVerdict:
        """Runs `job` on a free worker and waits for its answer; raises ClusterError where it gave none."""
        cid = candidate_id(job.problem, job.candidate)
        return self._answered(verify_task, RemoteVerdict, job.model_dump_json(), job.problem.name, cid)

    def baselines(self, job: BaselinesJob) -> RemoteBaselines:
        """Times one problem's baselines on a free worker and waits for its answer; raises ClusterError
        where it gave none."""
        return self._answered(baselines_task, RemoteBaselines, job.model_dump_json(), job.problem.name, "")

    def _answered(self, task: Callable[[str], str], model: type[A], payload: str, name: str, cid: str) -> A:
        """`task(payload)` until a worker whose harness runs answers, at most `RERUNS` times more: a
        worker whose harness cannot start (or whose GPU is gone) is withdrawn and the task sent to
        another; one that lost a harness process (replaced there) may take it again. The last answer
        (its `error` says why where it holds no result)."""
        withdrawn: list[str] = []
        again = 0
        answer = model.model_validate_json(self._run(task, payload, name, cid))
        while answer.error is not None and len(withdrawn) + again < RERUNS:
            if answer.broken:
                self._withdraw(answer)
                withdrawn.append(answer.worker)
            else:
                again += 1
            answer = model.model_validate_json(self._run(task, payload, name, cid))
        if withdrawn or again:
            with self._lock:
                self.retried.append(Retry(problem=name, candidate_id=cid, deaths=0, withdrawn=withdrawn, again=again))
        return answer

    def _withdraw(self, answer: RemoteAnswer) -> None:
        """Withdraws the worker: its slot taken away first (`GPU=0`: the scheduler places nothing more
        there), then the worker retired (closed with its nanny, not restarted), so that a task the
        scheduler had already queued there is placed on another worker, not left waiting for a slot
        that never frees. Its log says what broke; its host's operator mends it and starts it again."""
        try:
            self.client.run(_no_slot, workers=[answer.address])
            self.client.retire_workers(workers=[answer.address], close_workers=True)
        except (OSError, TimeoutError, KeyError, ValueError) as exc:  # gone meanwhile: nothing to withdraw
            log.info("worker %s not withdrawn (gone: %s)", answer.where, exc)
        with self._lock:
            self.withdrawn[answer.worker] = answer.error or ""
            self._counted = 0.0  # its slot is gone: count them again
        log.warning("withdrew Dask worker %s (%s): %s", answer.where, answer.address, answer.error)

    def echo(self, payload: str) -> str:
        """A task that does nothing, sent as a verification is: what the path itself costs (the bench's)."""
        return self._run(echo_task, payload, "echo", "")

    def _run(self, task: Callable[[str], str], payload: str, name: str, cid: str) -> str:
        """`task(payload)` on a free worker, holding one slot, a re-run after its worker died noted."""
        with self._slot():
            key = f"{task.__name__}-{name}-{os.urandom(6).hex()}"
            future = self.client.submit(task, payload, resources={GPU_RESOURCE: 1}, pure=False, retries=0, key=key)
            try:
                return self._result(future)
            except KilledWorker as exc:
                what = "baselines" if task is baselines_task else "verification"
                raise ClusterError(
                    f"the {what} of {name} lost its worker {self.plan.allowed_failures + 1} times ({exc}); it "
                    "is not re-run again: check the workers' logs (out of memory, a lost GPU) and rerun to try it "
                    "once more") from exc
            finally:
                self._note_retry(name, cid, key)
                future.release()

    def _result(self, future: Any) -> str:
        """The task's answer; raises ClusterError where every worker was withdrawn meanwhile (the task
        would wait for one forever)."""
        while True:
            try:
                return str(future.result(timeout=WATCH_S))
            except TimeoutError:
                if self.withdrawn:
                    self._usable()

    @contextmanager
    def _slot(self) -> Iterator[None]:
        """Holds one of the cluster's slots for the block, waiting while all are taken."""
        with self._turn:
            while self._in_flight >= max(1, self._usable()):
                self._turn.wait(timeout=REFRESH_S)
            self._in_flight += 1
        try:
            yield
        finally:
            with self._turn:
                self._in_flight -= 1
                self._turn.notify()

    def _usable(self) -> int:
        """The slots now; raises ClusterError where none is left because every worker was withdrawn."""
        slots = self.capacity
        if slots < 1 and self.withdrawn:
            why = "; ".join(f"{w}: {e}" for w, e in sorted(self.withdrawn.items()))
            raise ClusterError(f"no worker of the cluster can run the harness any more, each withdrawn ({why}); "
                               "mend their hosts (`kb-mcp doctor` there) and rerun")
        return slots

    def _note_retry(self, name: str, cid: str, key: str) -> None:
        """Notes a task that was re-run after its worker died (the scheduler's count)."""
        try:
            deaths = int(self.client.run_on_scheduler(_deaths, key))
        except (OSError, TimeoutError):
            return  # the scheduler is gone: nothing to note, the caller hears of it
        if deaths:
            with self._lock:
                self.retried.append(Retry(problem=name, candidate_id=cid, deaths=deaths))

    def warm(self) -> dict[str, str]:
        """Starts every worker's harness now rather than at its first verification: each worker's device
        (`WorkerInfo.device`, with its UUID), by worker address."""
        return dict(self.client.run(_warm_harness))

    def close(self) -> None:
        """Stops the local workers and the scheduler (a joined cluster is only left)."""
        client, self._client = self._client, None
        cluster, self._cluster = self._cluster, None
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
        self._config.__exit__(None, None, None)


def verify_on(cluster: Cluster, ctx: ToolContext,
              request: compile_and_verify.Request) -> tuple[compile_and_verify.Result, RemoteVerdict]:
    """`compile_and_verify` with the verification on a worker of the cluster: the request read and
    checked here, the candidate verified there, its verdict stored here exactly as the tool stores its
    own (`compile_and_verify.record`). Raises ToolError as the tool does, ClusterError where the cluster
    gave no result."""
    problem, candidate = compile_and_verify.prepare(request, ctx.files)
    remote = cluster.verify(VerifyJob(problem=problem, candidate=candidate, options=request.options))
    if remote.result is None:
        raise ClusterError(remote.error or f"the worker {remote.where} sent no result (ours to fix)")
    return compile_and_verify.record(ctx, request, problem, candidate, remote.result), remote


async def _serve(address: str, specs: list[WorkerSpec], private: list[str]) -> None:
    gpu = any(w.device is not None for w in specs)
    plugin = HarnessPlugin(private, spare=gpu)
    _no_nanny_defaults()
    nannies = [Nanny(address, nthreads=1, resources=s.resources, name=f"{socket.gethostname()}-{s.name}",
                     env=s.env, plugins=(plugin,)) for s in specs]
    await asyncio.gather(*(n.start() for n in nannies))
    try:
        await asyncio.gather(*(n.finished() for n in nannies))
    finally:
        await asyncio.gather(*(n.close() for n in nannies), return_exceptions=True)


def serve_workers(address: str, specs: list[WorkerSpec], private: Iterable[str | Path] = ()) -> None:
    """Runs one worker per spec (each its own process, pinned to its GPU) for the scheduler at
    `address`, until they are closed or this process is interrupted (`kb-mcp worker`)."""
    asyncio.run(_serve(address, specs, [str(p) for p in private]))
