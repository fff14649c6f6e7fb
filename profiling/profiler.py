"""Profiles one forward pass of a problem (or a candidate) under Nsight Compute.

The driver process (`profile_driver.py`) runs under `ncu`, which is restricted to the NVTX range
around the single profiled forward and collects the sections that speak to bottlenecks plus the
explicit raw metrics the parser reads. The report is exported as two CSV pages (raw metrics and
rule findings), parsed into `KernelProfile`s and returned as a `Profile`.

Where counters cannot be read (ncu absent, or `ERR_NVGPUCTRPERM`), the driver runs again without
ncu under torch.profiler and the profile carries per-kernel timings only, with
`counters_available=False` and the reason.

The driver runs the problem's and the candidate's code, so ncu and the driver run together in the
sandbox (`harness.sandbox.sandbox`, role `driver`: the GPU, the published builds read-only, a scratch
folder of their own for the spec, the driver's report, the trace and ncu's report); so does the
export of ncu's report (`ncu --import`, which reads a file the sandbox wrote). This side only
reads what they leave, and moves ncu's report to where the caller wants it.
"""

from __future__ import annotations

import contextvars
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from kb_mcp.harness.attempt_findings import naming_attempts, profile_with_attempt
from kb_mcp.harness.gpu import lane
from kb_mcp.harness.problem import Problem, candidate_id
from kb_mcp.harness.profile_model import KernelProfile, Profile
from kb_mcp.harness.protocol import EXIT_NO_GPU, DriverReport, DriverSpec, ProblemFailed
from kb_mcp.harness.sandbox.attempts import collecting
from kb_mcp.harness.sandbox.sandbox import Sandbox, detect
from kb_mcp.harness.sandbox.scratch import new_scratch
from kb_mcp.harness.sandbox.watch import follow_active
from kb_mcp.kb.progress import Progress, no_progress
from kb_mcp.profiling import ncu_parse
from kb_mcp.profiling.ncu_parse import counters_blocked_reason, kernels_from_trace
from kb_mcp.profiling.ncu_run import (
    ENV_NCU,
    SECTIONS,
    SOURCE_SECTIONS,
    NcuProcess,
    NcuRun,
    ProfileOptions,
    ProfilerError,
    Spawner,
    export_commands,
    export_pages,
    find_ncu,
    ncu_command,
    profile_target,
    run_ncu,
)
from kb_mcp.profiling.profile_standby import Standby, StandbyKey, StandbyPool, driver_args

# The names of ncu's runs (`profiling.ncu_run`) stay importable from here, where callers find them.
__all__ = [
    "ENV_NCU", "SECTIONS", "SOURCE_SECTIONS", "NcuProcess", "NcuRun", "NoGpuError", "ProblemFailedError",
    "ProfileOptions", "ProfilerError", "Spawner", "counters_blocked_reason", "export_commands", "export_pages",
    "find_ncu", "kernels_from_trace", "ncu_command", "profile", "profile_target", "run_ncu", "standby_key",
    "standby_launcher", "start_standby",
]


class NoGpuError(ProfilerError):
    """No CUDA device is visible: profiling needs one."""


class ProblemFailedError(ProfilerError):
    """The problem's own code failed in the driver: no candidate is to blame. `failed` says how, in
    the words a verification uses for it (`ProblemFailed`, `VerifyResult.problem_error`)."""

    def __init__(self, failed: ProblemFailed) -> None:
        super().__init__(failed.text)
        self.failed = failed


# Driver stages that run only the problem's code, as ProblemFailed names them; without a candidate,
# building the model is the problem's code too.
_PROBLEM_STAGES = {"load_problem": "import", "init_inputs": "inputs", "inputs": "inputs"}
_REFERENCE_STAGES = {**_PROBLEM_STAGES, "build": "construct"}


def _run_on_standby(
    standby: Standby, spec: DriverSpec, made: Path, options: ProfileOptions, log_path: Path, progress: Progress
) -> NcuRun | None:
    """Hands `spec` to a waiting driver and waits for ncu; None if the driver had gone meanwhile.

    The driver sees only its own folder: the spec is rewritten to use it, and what the driver and
    ncu leave there (the driver's report, ncu's report) is moved to where `spec` and `made` say."""
    progress(0, None, "handing the model to the waiting profiler")
    handed = time.perf_counter()
    folder = standby.folder
    try:
        standby.hand_over(spec.model_copy(update={
            "workdir": str(folder / "src"), "report_path": str(folder / "driver.json"),
            "trace_path": str(folder / "trace.json")}))
        process = cast(NcuProcess, standby.process)  # the pool holds what `standby_launcher` started
        follow_active(process.proc)  # it started before this profile: its attempts are this profile's
        run = process.finish(options.timeout_s, log_path, progress, since=handed)
        if not standby.claimed():
            return None  # it exited (idle or owner check) just before the spec arrived: run cold
        for left, wanted in ((folder / "driver.json", Path(spec.report_path)),
                             (Path(str(standby.report_base) + ".ncu-rep"), made)):
            if left.is_file() and not left.is_symlink():
                shutil.move(str(left), wanted)
        return run
    finally:
        standby.close()


def standby_key(ncu: str, options: ProfileOptions, cache_dir: Path | None, pool: StandbyPool | None) -> StandbyKey:
    """The ncu command line a profile with `options` runs, as a standby for it must have been started
    with: the metrics the parser reads less those this pool saw refused, and the build cache."""
    wanted = ncu_parse.requested_metrics()
    metrics = pool.metrics(wanted) if pool is not None else wanted
    return StandbyKey(ncu, options.source_counters, options.max_kernels, tuple(metrics), str(cache_dir))


def start_standby(pool: StandbyPool, options: ProfileOptions, cache_dir: Path, sandbox: Sandbox) -> Standby | None:
    """Starts a driver in standby for the next profile with `options` before any profile ran (a
    server's start), exactly as a profile starts one for the next: the same key, the same launch.
    None where none is started: no ncu, counters not asked for, or the pool's rules (one waits
    already, closed, disabled, standby turned off)."""
    ncu = find_ncu() if options.counters else None
    if ncu is None:
        return None  # that profile runs the timeline in a fresh process: nothing to wait for it
    spawner = Spawner(sandbox, cache_dir, ncu)
    key = standby_key(ncu, options, spawner.cache_dir, pool)
    return pool.launch(key, standby_launcher(ncu, key, pool, spawner))


def standby_launcher(ncu: str, key: StandbyKey, pool: StandbyPool, spawner: Spawner) -> Callable[[Path], NcuProcess]:
    """How the pool starts the next standby: the same ncu command line, the driver waiting in `folder`
    (its scratch: the only place it writes)."""
    def launch(folder: Path) -> NcuProcess:
        owner = None if spawner.sandbox.confined else os.getpid()  # confined: it dies with this process
        target = [sys.executable, "-m", "kb_mcp.harness.worker.profile_driver",
                  *driver_args(folder, pool.idle_s, owner)]
        cmd = ncu_command(ncu, folder / "report", target, metrics=list(key.metrics),
                          source_counters=key.source_counters, max_kernels=key.max_kernels)
        return spawner.process(cmd, folder)

    return launch


def _read_driver_report(path: Path, returncode: int, output: str) -> DriverReport:
    if path.is_file():
        return DriverReport.model_validate_json(path.read_text())
    tail = output.strip()[-1500:]
    return DriverReport(ok=False, stage="driver", error=f"the profiling driver exited with {returncode} "
                        f"without a report; its output ends with:\n{tail}")


def _raise_for_driver(report: DriverReport, returncode: int, candidate: bool) -> None:
    if report.ok:
        return
    problem_stage = (_PROBLEM_STAGES if candidate else _REFERENCE_STAGES).get(report.stage)
    if problem_stage is not None:
        raise ProblemFailedError(ProblemFailed(stage=problem_stage, error=report.error or "no message"))
    if returncode == EXIT_NO_GPU or report.stage == "device":
        raise NoGpuError("profiling needs a CUDA GPU, and none is visible on this machine")
    who = "the candidate" if candidate else "the problem's model"
    raise ProfilerError(f"{who} failed while profiling (stage: {report.stage}): {report.error}")


def profile(
    problem: Problem,
    candidate_source: str | None,
    *,
    profile_id: str,
    report_base: Path,
    cache_dir: Path,
    options: ProfileOptions | None = None,
    progress: Progress = no_progress,
    standby: StandbyPool | None = None,
    sandbox: Sandbox | None = None,
) -> Profile:
    """Profiles one forward of `problem` (or of the candidate's ModelNew) and returns the Profile.

    The ncu report, if one is made, is kept at `<report_base>.ncu-rep`. With a `standby` pool the
    forward runs on a driver started after the previous profile (see `profiling.profile_standby`),
    and a new one is started for the next profile. Everything that runs the model runs in
    `sandbox` (default: `harness.sandbox.sandbox.detect()`).
    Raises ProblemFailedError when the problem's own code fails (checked before the GPU is),
    NoGpuError without a GPU, and ProfilerError when the model or candidate fails.
    """
    options = options or ProfileOptions()
    sandbox = sandbox or detect()
    start = time.perf_counter()
    cand_id = candidate_id(problem, candidate_source) if candidate_source is not None else None
    work = new_scratch("profile")
    try:
        spec = DriverSpec(
            problem_source=problem.source,
            problem_module=f"kbmcp_problem_{problem.hash}",
            candidate_source=candidate_source,
            candidate_module=f"kbmcp_{cand_id}" if cand_id else None,
            warmup=options.warmup,
            workdir=str(work / "src"),
            report_path=str(work / "driver.json"),
            trace_path=str(work / "trace.json"),
            cache_dir=str(cache_dir),
        )
        ncu = find_ncu() if options.counters else None
        spawner = Spawner(sandbox, cache_dir, ncu)
        notes = [] if sandbox.confined else [sandbox.describe()]
        reason: str | None = None
        if not options.counters:
            reason = "counters not requested (counters=false): per-kernel timings only"
        elif ncu is None:
            reason = ("ncu (Nsight Compute) was not found: per-kernel timings only; install Nsight Compute or set "
                      "KB_MCP_NCU")
        # the attempts of the driver, ncu and its export go into the profile; a GPU tool holds the lane already
        with collecting() as seen, naming_attempts(seen, ProfilerError), lane.hold(f"profile {problem.name}", progress):
            if ncu is not None:
                result = _profile_ncu(ncu, spec, spawner, work, report_base, problem, cand_id, profile_id, options,
                                      standby, progress, notes, start)
                if isinstance(result, Profile):
                    return profile_with_attempt(result, seen)
                reason = result
            return profile_with_attempt(_profile_timeline(spec, spawner, work, problem, cand_id, profile_id,
                                                          options, progress, notes, reason, start), seen)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _profile_ncu(ncu: str, spec: DriverSpec, spawner: Spawner, work: Path, report_base: Path, problem: Problem,
                 cand_id: str | None, profile_id: str, options: ProfileOptions, standby: StandbyPool | None,
                 progress: Progress, notes: list[str], start: float) -> Profile | str:
    """The profile under ncu, or the reason counters are unavailable (then the timeline runs)."""
    driver = [sys.executable, "-m", "kb_mcp.harness.worker.profile_driver"]
    spec_ncu = spec.model_copy(update={"mode": "ncu"})
    spec_path = work / "spec_ncu.json"
    spec_path.write_text(spec_ncu.model_dump_json())
    report = Path(str(report_base) + ".ncu-rep")  # where the caller keeps it
    made = Path(str(work / "report") + ".ncu-rep")  # where ncu writes it, inside the sandbox's scratch
    report.parent.mkdir(parents=True, exist_ok=True)
    key = standby_key(ncu, options, spawner.cache_dir, standby)
    metrics = list(key.metrics)
    waiting = standby.take(key) if standby is not None else None
    first = (_run_on_standby(waiting, spec_ncu, made, options, work / "ncu.log", progress)
             if waiting is not None else None)
    if first is None:
        progress(0, None, "starting the model under Nsight Compute")
    run, dropped = profile_target(ncu, driver + [str(spec_path)], work / "report", spawner=spawner, scratch=work,
                                  options=options, log_path=work / "ncu.log", progress=progress, metrics=metrics,
                                  first=first)
    if standby is not None:
        _prepare_next(standby, ncu, key, dropped, run, spawner)
    if run.timed_out:
        raise ProfilerError(f"profiling took longer than {options.timeout_s:.0f} s and was stopped; "
                            "lower max_kernels or the problem size, or raise timeout_s")
    if dropped:
        notes.append(f"metrics unknown to this ncu/GPU were left out: {', '.join(dropped)}")
    reason = counters_blocked_reason(run.output)
    if reason is not None:
        return reason
    driver_report = _read_driver_report(Path(spec.report_path), run.returncode, run.output)
    _raise_for_driver(driver_report, run.returncode, spec.candidate_source is not None)
    kernels: list[KernelProfile] = []
    phases = dict(driver_report.phases_s)
    phases["ncu_run"] = round(run.wall_s, 3)
    if made.is_file() and not made.is_symlink():
        progress(len(run.passes), None, "reading the report")
        t0 = time.perf_counter()
        raw, details = export_pages(ncu, made, spawner)
        kernels = ncu_parse.parse_ncu_csv(raw, details)
        phases["export_and_parse"] = round(time.perf_counter() - t0, 3)
        shutil.move(str(made), report)
    elif run.returncode != 0:
        raise ProfilerError(f"ncu failed (exit {run.returncode}): {run.output.strip()[-1500:]}")
    if not kernels:
        notes.append("no CUDA kernel ran inside the profiled forward")
    if len(kernels) >= options.max_kernels:
        notes.append(f"stopped after {options.max_kernels} kernel launches (max_kernels)")
    if run.passes:
        notes.append(f"ncu replayed each kernel {max(run.passes)} times (passes); its clocks are "
                     "locked to base and caches flushed, so durations are not speedup timings")
    result = _assemble(profile_id, problem, cand_id, driver_report, kernels, notes,
                       report_file=str(report) if report.is_file() else None, wall_s=time.perf_counter() - start)
    result.phases_s = phases
    return result


def _profile_timeline(spec: DriverSpec, spawner: Spawner, work: Path, problem: Problem, cand_id: str | None,
                      profile_id: str, options: ProfileOptions, progress: Progress, notes: list[str],
                      reason: str | None, start: float) -> Profile:
    """Per-kernel timings from torch.profiler, no counters (ncu absent, refused, or not asked for)."""
    driver = [sys.executable, "-m", "kb_mcp.harness.worker.profile_driver"]
    spec_path = work / "spec_timeline.json"
    spec_path.write_text(spec.model_copy(update={"mode": "timeline"}).model_dump_json())
    progress(0, None, "timing kernels without counters")
    code, output = spawner.sandbox.run(driver + [str(spec_path)], spawner.grant(work), timeout_s=options.timeout_s)
    if code == -9:
        raise ProfilerError(f"the timing run took longer than {options.timeout_s:.0f} s and was stopped")
    driver_report = _read_driver_report(Path(spec.report_path), code, output)
    _raise_for_driver(driver_report, code, spec.candidate_source is not None)
    trace_path = Path(spec.trace_path or "")
    if trace_path.is_symlink() or not trace_path.is_file() or trace_path.stat().st_size > TRACE_LIMIT:
        raise ProfilerError("the profiling driver left no usable trace")
    kernels = kernels_from_trace(json.loads(trace_path.read_text()))
    result = _assemble(profile_id, problem, cand_id, driver_report, kernels, notes,
                       report_file=None, wall_s=time.perf_counter() - start)
    result.counters_available = False
    result.counters_reason = reason
    result.method = "timeline"
    result.phases_s = dict(driver_report.phases_s)
    return result


TRACE_LIMIT = 512 << 20  # a Chrome trace of one forward; anything larger is not the driver's


def _prepare_next(pool: StandbyPool, ncu: str, key: StandbyKey, dropped: list[str], run: NcuRun,
                  spawner: Spawner) -> None:
    """Starts the standby for the next profile (the GPU is free again: this run's ncu has exited)."""
    pool.dropped_metrics.update(dropped)
    blocked = counters_blocked_reason(run.output)
    if blocked is not None or run.returncode == EXIT_NO_GPU:
        pool.disable(blocked or "no GPU")
        return
    if run.timed_out:
        return
    key = StandbyKey(key.ncu, key.source_counters, key.max_kernels,
                     tuple(m for m in key.metrics if m not in pool.dropped_metrics), key.env_key)
    # In an empty context: what the standby tries is the next profile's (it follows it), not this one's.
    contextvars.Context().run(pool.launch, key, standby_launcher(ncu, key, pool, spawner))


def _assemble(
    profile_id: str,
    problem: Problem,
    cand_id: str | None,
    driver_report: DriverReport,
    kernels: list,
    notes: list[str],
    *,
    report_file: str | None,
    wall_s: float,
) -> Profile:
    total_ns = sum(k.metrics.duration_ns or 0.0 for k in kernels)
    total_cycles = sum(k.metrics.elapsed_cycles or 0.0 for k in kernels)
    return Profile(
        profile_id=profile_id,
        problem=problem.name,
        candidate_id=cand_id,
        device=driver_report.device,
        arch=driver_report.arch,
        total_gpu_time_ns=total_ns,
        total_elapsed_cycles=total_cycles,
        kernels=kernels,
        report_file=report_file,
        notes=notes,
        wall_s=wall_s,
    )
