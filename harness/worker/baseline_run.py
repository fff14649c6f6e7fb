"""The baselines of a problem alone, without a candidate (worker side): `kb-mcp eval --baselines`.

The table KernelBench users keep per GPU: eager and torch.compile of the reference, timed exactly as
a verification times them (`harness.worker.timing`: fresh inputs from a secret seed per run, made
outside the timed region, L2 flushed, CUDA events, the track's numerics), in a verify worker, so the
figures are the ones later verdicts of the problem are judged against (the pool caches them).

Memory as in a verification (`harness.gpu.memory`): the footprint is read on the meta device first, a
problem whose eager forward does not fit the free memory is refused with the numbers
(`BaselineReply.too_large`) before anything is allocated, each run makes its own input set and drops
it, and the peak the worker's allocator reserved is reported.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from kb_mcp.harness.baselines import Baseline
from kb_mcp.harness.gpu.memory import TooLarge, fits_eager
from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.phases import StepClock
from kb_mcp.harness.problem import Problem
from kb_mcp.harness.protocol import BaselineReply, ProblemFailed
from kb_mcp.harness.worker.footprint import PeakMeter, device_free, measure, nbytes, request_peak, start_request
from kb_mcp.harness.worker.integrity_runtime import TrustedSnapshot
from kb_mcp.harness.worker.loading import load_module, short_traceback
from kb_mcp.harness.worker.timing import QUICK_RUNS, stop_rules
from kb_mcp.harness.worker.tracks import numerics, track_numerics
from kb_mcp.harness.worker.trusted import compiler_settings
from kb_mcp.harness.worker.values import secret_seed

__all__ = ["COMPILER_SETTINGS_CHANGED", "run_baselines"]

COMPILER_SETTINGS_CHANGED = ("torch.compile not timed: the problem's own code changed torch.compile's settings "
                             "(dynamo's or inductor's config) before it was compiled; the worker is replaced")


def _oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)


def run_baselines(env: Any, problem: Problem, options: VerifyOptions,
                  report: Callable[[str], None]) -> tuple[BaselineReply | ProblemFailed, bool]:
    """Eager and torch.compile of `problem`'s reference on this worker's GPU; (reply, retire).

    The problem's own failures are `ProblemFailed` (the worker retires: the problem's code ran here);
    a problem too large for the free memory is a `BaselineReply` with `too_large` and no baseline."""
    t0 = time.perf_counter()
    phases = StepClock(_synced_clock)
    compiler = compiler_settings()  # before the problem's code runs
    peaks: list[int] = []
    start_request(peaks)
    name = f"kbmcp_baseline_problem_{next(env.counter)}"
    files = (str(env.workdir / f"{name}.py"),)
    try:
        try:
            pmod = load_module(problem.source, name, env.workdir)
        except Exception as exc:  # noqa: BLE001 - the problem's code
            return ProblemFailed(stage="import", error=short_traceback(exc, files)), True
        footprint = measure(pmod)
        phases.mark("load")
        free, total = device_free()
        if not fits_eager(footprint, free):
            return BaselineReply(footprint=footprint, too_large=TooLarge(
                what="eager", needed_bytes=footprint.eager_bytes, free_bytes=free, total_bytes=total,
                footprint=footprint)), False
        with track_numerics(options.track, None):
            reply = _measure(env, problem, options, pmod, footprint, peaks, report, files, phases, compiler)
        if isinstance(reply, BaselineReply):
            reply = reply.model_copy(update={"peak_bytes": request_peak(peaks), "phases": phases.seconds,
                                             "elapsed_s": round(time.perf_counter() - t0, 3)})
            # the settings it changed would stay for the next problem timed in this worker
            tampered = reply.baseline is not None and reply.baseline.compile_note == COMPILER_SETTINGS_CHANGED
            return reply, tampered
        return reply, isinstance(reply, ProblemFailed)
    finally:
        sys.modules.pop(name, None)
        torch.cuda.empty_cache()


def _synced_clock() -> float:
    """The time, once the GPU has finished what was issued (a step's seconds include its kernels)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def _measure(env: Any, problem: Problem, options: VerifyOptions, pmod: Any, footprint: Any, peaks: list[int],
             report: Callable[[str], None], files: tuple[str, ...], phases: StepClock,
             compiler: tuple[object, ...]) -> BaselineReply | ProblemFailed:
    """The reference built, eager's peak and series, then torch.compile's series (see `run_baselines`)."""
    timer = env.timer
    try:
        init = [x.cuda() if isinstance(x, torch.Tensor) else x for x in pmod.get_init_inputs()]
        torch.manual_seed(secret_seed())
        ref = pmod.Model(*init).cuda().eval()
    except Exception as exc:  # noqa: BLE001 - the problem's code
        return _failed("construct", exc, footprint, files)
    phases.mark("construct")

    def make(i: int) -> list[Any]:
        torch.manual_seed(secret_seed())
        with torch.device("cuda"):
            xs = list(pmod.get_inputs())
        torch.manual_seed(secret_seed())
        return [x.cuda() if isinstance(x, torch.Tensor) and not x.is_cuda else x for x in xs]

    quick = not options.timing
    warm = 1 if quick else options.warmup_runs
    report("eager")
    try:
        with torch.no_grad():
            xs = make(-1)
            with PeakMeter(peaks) as meter:
                ref(*xs)
            footprint = footprint.model_copy(update={"eager_peak_bytes": footprint.param_bytes + nbytes(xs)
                                                     + meter.extra})
            del xs
            runs = QUICK_RUNS if quick else timer.runs_for(ref, make, False, options.timed_runs)
            wall, precision = stop_rules(options.timed_runs)
            eager = timer.series(ref, make, runs, warm, wall_s=wall, precision=precision)
    except Exception as exc:  # noqa: BLE001 - the problem's forward
        return _failed("forward", exc, footprint, files)
    phases.mark("eager")
    baseline = Baseline(problem_hash=problem.hash, device=env.device, torch_version=env.torch_version,
                        eager_ms=eager.median_ms, eager_runs=len(eager.gpu_ms), eager_issue_ms=eager.issue_median_ms,
                        track=options.track.value, numerics=numerics())
    if options.compile_baseline and compiler_settings() != compiler:
        baseline = baseline.model_copy(update={"compile_note": COMPILER_SETTINGS_CHANGED})
    elif options.compile_baseline:
        report("compile")
        baseline = _compiled(env, ref, make, baseline, quick, warm, phases)
    return BaselineReply(baseline=baseline, footprint=footprint)


def _compiled(env: Any, ref: Any, make: Callable[[int], list[Any]], baseline: Baseline, quick: bool,
              warm: int, phases: StepClock) -> Baseline:
    """torch.compile of the reference timed like eager; a model it cannot compile keeps the reason."""
    timer = env.timer
    try:
        with torch.no_grad():
            compiled = torch.compile(ref)
            compiled(*make(-1))  # the first call compiles (and autotunes): its cost apart from the series'
            phases.mark("compile")
            cruns = QUICK_RUNS if quick else timer.runs_for(compiled, make, False, None)
            wall, precision = stop_rules(None)
            stats = timer.series(compiled, make, cruns, warm, wall_s=wall, precision=precision)
        baseline = baseline.model_copy(update={"compile_ms": stats.median_ms, "compile_runs": len(stats.gpu_ms)})
        phases.mark("compile_timed")
    except Exception as exc:  # noqa: BLE001 - torch.compile cannot handle every model
        baseline = baseline.model_copy(update={"compile_note": f"torch.compile failed: {type(exc).__name__}: "
                                                               f"{str(exc)[:300]}"})
    # A first torch.compile installs patches of its own: the next candidate is checked against that state.
    env.snapshot = TrustedSnapshot.capture()
    return baseline


def _failed(stage: str, exc: BaseException, footprint: Any, files: tuple[str, ...]) -> BaselineReply | ProblemFailed:
    """The problem's own failure; out of memory there is its size on this GPU, with the numbers."""
    if _oom(exc):
        torch.cuda.empty_cache()
        free, total = device_free()
        return BaselineReply(footprint=footprint, too_large=TooLarge(
            what="eager", needed_bytes=footprint.eager_bytes, free_bytes=free, total_bytes=total, footprint=footprint))
    return ProblemFailed(stage="construct" if stage == "construct" else "forward", error=short_traceback(exc, files))
