"""The kernel census, run in a worker process of its own so that timing workers never profile.

The census (`integrity_runtime.census`: which GPU kernels one forward launches, and whose) needs a
profiler session, and after a profiler session CUPTI can keep the host cost of every launch
raised for the rest of the process (`integrity_runtime.forbid_profiler` says by how much). A
worker that times candidates and baselines therefore never starts one. The pool keeps a census
worker (the same program, `--role census`, its first profiler session paid at start) and asks it
once per candidate: after the candidate has passed every check in the timing worker, and before
it is timed there. The timing worker waits for the answer, so the census never overlaps a timed
run.

In the census worker the candidate is imported (its builds come from the shared content-hashed
cache), ModelNew is constructed, forward runs once (lazy builds and first-call set-up happen
there) and then once under the profiler. Then its device time (`kernels.DeviceTime`,
`profiling.measure_device_time`): up to `profiling.DEVICE_RUNS` more calls on the same inputs, the
L2 flushed before each, in one more profiler session. Where the pool asks (`CensusRequest.
reference_device`: the cached baseline lacks it), the reference's device time is measured the
same way first, right after the problem is imported and before this candidate's code runs here, in
the track's numerics; the pool sends such a request only to a census worker no candidate has run in
yet (`WorkerPool._census_worker`), since the figure is cached and shown beside later candidates'.
The answer is the census plus the census worker's own integrity findings (trusted functions
replaced, threads left running, L2 persistence); the census worker retires after any of them or
after the candidate raised. The kernel findings proper
(`library_call`, `no_custom_kernel`) are drawn from the census by the timing worker, with the
candidate's allow-list, as `IntegrityGuard.findings` always did.

`protocol.CensusReply` is plain pydantic (no torch): the pool reads it and passes it on.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from kb_mcp.harness.judgment.kernels import DeviceTime, kernel_ops
from kb_mcp.harness.judgment.verdict import Failure, FailureKind, Finding, VerifyOptions
from kb_mcp.harness.problem import Problem
from kb_mcp.harness.protocol import CensusReply, ProblemFailed
from kb_mcp.harness.worker import integrity_runtime as rt
from kb_mcp.harness.worker.fault import Blame, first_line, is_out_of_memory, raised_in, tensor_bytes
from kb_mcp.harness.worker.footprint import start_request
from kb_mcp.harness.worker.loading import load_module, short_traceback
from kb_mcp.harness.worker.profiling import measure_device_time
from kb_mcp.harness.worker.timing import L2Flusher
from kb_mcp.harness.worker.tracks import track_numerics
from kb_mcp.harness.worker.values import secret_seed


def run_census(env: Any, problem: Problem, source: str, options: VerifyOptions, report: Callable[[str], None],
               reference_device: bool = False, reference_ops: bool = False) -> tuple[CensusReply | ProblemFailed, bool]:
    """Census of one candidate's forward and its device time (census worker side), with the
    reference's device time first where `reference_device`; returns (reply, retire_worker).

    `env` is the census worker's `verify.WorkerEnv`. Without CUDA the forward still runs (on CPU
    tensors), and the census says it saw no GPU. A problem that fails to import is the problem's
    failure (ProblemFailed), not the candidate's. How a census that could not be taken ended is a
    `verdict.Failure` in the reply (`judge` words it).
    """
    t0 = time.perf_counter()
    if env.builders is not None:
        env.builders.reset()
    peaks: list[int] = []
    if env.cuda:
        start_request(peaks)
    run = _CensusRun(env)
    if env.cuda:
        # A clean L2 state first, so that whatever is found afterwards is the candidate's doing: a
        # census worker that never reset it reported a persisting set-aside of 9830400 bytes on an
        # H100 (driver 580) before any candidate could have set one.
        rt.reset_l2_persistence()
    report("import")
    try:
        pmod = run.load(problem.source, "kbmcp_census_problem")
    except Exception as exc:  # noqa: BLE001 - the problem's own failure: no candidate code has run yet
        sys.modules.pop(run.names[-1], None)
        failed = ProblemFailed(stage="import", error=short_traceback(exc, (str(env.workdir / f"{run.names[-1]}.py"),)))
        return failed, True
    reference = None
    if reference_device:
        report("reference")
        reference = run.reference_device(pmod, options)
    kept = None
    if reference_ops:  # composed mode: the reference's kernel-launching ops, before the candidate's code runs here
        report("reference")
        kept = run.reference_ops(pmod, options)
    failure = run.forward(pmod, source, options, report)
    findings, broken = run.leftovers()
    broken = run.cleanup() or broken
    reply = CensusReply(
        census=run.census.model_dump(mode="json") if run.census is not None else None, findings=findings,
        failure=failure or broken, pid=os.getpid(), elapsed_s=round(time.perf_counter() - t0, 3),
        device=run.device_time, reference_device=reference, reference_ops=kept,
        peak_bytes=run.peak if env.cuda else None,
    )
    return reply, not reply.clean


class _CensusRun:
    """One census in the census worker: the modules it imported, and what the forward left."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.device = "cuda" if env.cuda else "cpu"
        self.names: list[str] = []  # modules imported (dropped by `cleanup`)
        self.files: tuple[str, ...] = ()  # the candidate's file, for its tracebacks
        self.before = rt.ThreadCensus.take()
        self.census: Any = None
        self.device_time: DeviceTime | None = None
        self.threads: list[Finding] | None = None  # counted before the profiler session starts its own
        self.peak: int | None = None  # the most the allocator reserved (taken before the cached blocks go back)
        self.blame = Blame()  # whose fault running out of memory is (`fault.Blame`), and the last call

    def load(self, text: str, stem: str) -> Any:
        name = f"{stem}_{next(self.env.counter)}"
        self.names.append(name)
        return load_module(text, name, self.env.workdir)

    def _sync(self) -> None:
        if self.env.cuda:
            self.env.snapshot.trusted.synchronize()

    def _device_time(self, call: Callable[[], Any], options: VerifyOptions) -> DeviceTime:
        """`call`'s device time (`profiling.measure_device_time`) in the track's numerics, the L2
        flushed before each run as the timer flushes it."""
        if not self.env.cuda:
            return DeviceTime(note="no CUDA device: device time not measured")
        flusher = L2Flusher(int(self.env.props.L2_cache_size))
        with track_numerics(options.track, None):
            return measure_device_time(call, flusher)

    def reference_device(self, pmod: Any, options: VerifyOptions) -> DeviceTime:
        """The reference's device time (its Model, eager), before this candidate's code runs here; the
        problem's own code failing leaves it unknown, with a note (the verify worker judges the problem).
        Its model and inputs are gone, and their blocks given back, before the candidate's forward."""
        if not self.env.cuda:
            return DeviceTime(note="no CUDA device: device time not measured")
        try:
            return self._reference_time(pmod, options)
        except Exception as exc:  # noqa: BLE001 - the problem's code: anything may go wrong
            return DeviceTime(note=f"the reference raised while its device time was measured: "
                                   f"{type(exc).__name__}: {str(exc)[:200]}")
        finally:
            torch.cuda.empty_cache()

    def reference_ops(self, pmod: Any, options: VerifyOptions) -> list[str] | None:
        """The PyTorch ops that launch the reference's kernels in one forward (`kernels.kernel_ops`),
        after a first call, in the track's numerics; None where the census saw no device or the
        problem's code raised (the verify worker judges the problem)."""
        if not self.env.cuda:
            return None
        try:
            ref, xs = self._construct(pmod, pmod.Model)
            with torch.no_grad(), track_numerics(options.track, None):
                ref(*xs)  # first call: lazy set-up (library handles, autotuning), as for the candidate
                self._sync()
                census = rt.census(lambda: ref(*xs))
            return kernel_ops(census) if census.available else None
        except Exception:  # noqa: BLE001 - the problem's code: anything may go wrong
            return None
        finally:
            torch.cuda.empty_cache()

    def _reference_time(self, pmod: Any, options: VerifyOptions) -> DeviceTime:
        ref, xs = self._construct(pmod, pmod.Model)
        with torch.no_grad():
            with track_numerics(options.track, None):
                ref(*xs)  # first call: lazy set-up (library handles, autotuning), as the timer's warm-up
            self._sync()
            return self._device_time(lambda: ref(*xs), options)

    def forward(self, pmod: Any, source: str, options: VerifyOptions, report: Callable[[str], None]) -> Failure | None:
        """Imports and constructs the candidate, then runs forward once, once under the profiler and
        then for its device time; what it raised on the way is a `census_raised` failure, and running
        out of GPU memory in the harness's own allocations is weighed by `fault.Blame`."""
        where = "importing the candidate"
        self.blame.started(self.env.cuda)
        self.blame.calling(where)
        try:
            cmod = self.load(source, "kbmcp_census_candidate")
            self.files = self.blame.candidate_files = (str(getattr(cmod, "__file__", "")),)
            report("construct")
            where = "constructing ModelNew"
            self.blame.calling(where)
            model, xs = self._construct(pmod, cmod.ModelNew)
            self.blame.reference_bytes = tensor_bytes(list(model.parameters()))
            self.blame.set_bytes = lambda: 2 * tensor_bytes(xs)  # inputs, and outputs about their size
            report("census")
            where = "ModelNew.forward"
            self.blame.calling(where)
            self._take(model, xs, options)
        except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything, exits included
            if not self.files:
                self.files = self.blame.candidate_files = (str(self.env.workdir / f"{self.names[-1]}.py"),)
            detail = short_traceback(exc, self.files)
            if self.env.cuda and is_out_of_memory(exc):
                own = where != "ModelNew.forward" or raised_in(exc, self.files)
                memory = self.blame.out_of_memory(exc, own_call=own, where=where if own else (
                    "taking the kernel census in the census worker (the harness's own allocation)")).failure
                if memory.kind != FailureKind.out_of_memory:
                    return memory  # the machine's, or the candidate holding more than its share
            return Failure(kind=FailureKind.census_raised, where=where, detail=detail)
        return None

    def _construct(self, pmod: Any, cls: Any) -> tuple[Any, list[Any]]:
        """`cls` (ModelNew, or the problem's Model) built from the problem's init inputs, and one input set."""
        device = self.device
        init = [x.to(device) if isinstance(x, torch.Tensor) else x for x in pmod.get_init_inputs()]
        torch.manual_seed(secret_seed())
        model = cls(*init).to(device).eval()
        torch.manual_seed(secret_seed())
        with torch.device(device):
            xs = list(pmod.get_inputs())
        xs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]
        torch.manual_seed(secret_seed())
        return model, xs

    def _take(self, model: Any, xs: list[Any], options: VerifyOptions) -> None:
        # One input set on the device: only which kernels run and how long they take are read here, so
        # every call gets the same set (a candidate writing into it only changes its own census).
        with torch.no_grad():
            model(*xs)  # first call: lazy builds and one-time set-up, as in the checks
            self._sync()
            # Threads are counted up to here: a profiler session may start threads of its own.
            self.threads = rt.thread_findings(self.before, rt.ThreadCensus.take(), "import, construction and forward")
            args = xs
            if self.env.cuda:
                self.census = rt.census(lambda: model(*args), rt.expand_runtime_allow(options.allow))
            else:  # the same call, with nothing for a profiler to see
                model(*args)
                self.census = rt.census(lambda: None)
            self._sync()
            # The same inputs each run: only the device's time is read, not the outputs.
            self.device_time = self._device_time(lambda: model(*args), options)

    def leftovers(self) -> tuple[list[Finding], Failure | None]:
        """The census worker's own findings (threads, trusted functions, L2 persistence), and a
        broken CUDA context if reading the L2 state failed."""
        threads = self.threads
        if threads is None:
            threads = rt.thread_findings(self.before, rt.ThreadCensus.take(), "import, construction and forward")
        findings = threads + self.env.snapshot.verify()
        if self.env.cuda:
            try:
                findings += rt.l2_findings(rt.l2_state())
                rt.reset_l2_persistence()
            except Exception as exc:  # noqa: BLE001 - a broken context: the worker retires
                return findings, self._broken(exc)
        return findings, None

    def _broken(self, exc: BaseException) -> Failure:
        """The CUDA context broke after the candidate's last call (a kernel's fault, reported late)."""
        return Failure(kind=FailureKind.census_context_broken, where=self.blame.last, detail=first_line(exc))

    def cleanup(self) -> Failure | None:
        """Drops the imported modules and the cached GPU memory; a CUDA context that fails to is broken."""
        for name in self.names:
            sys.modules.pop(name, None)
        gc.collect()
        if self.env.cuda:
            try:
                self.peak = torch.cuda.max_memory_reserved()
                torch.cuda.empty_cache()
            except Exception as exc:  # noqa: BLE001
                return self._broken(exc)
        return None
