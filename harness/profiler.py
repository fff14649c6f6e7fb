"""Profiles one forward pass of a problem (or a candidate) under Nsight Compute.

The driver process (`profile_driver.py`) runs under `ncu`, which is restricted to the NVTX range
around the single profiled forward and collects the sections that speak to bottlenecks plus the
explicit raw metrics the parser reads. The report is exported as two CSV pages (raw metrics and
rule findings), parsed into `KernelProfile`s and returned as a `Profile`.

Where counters cannot be read (ncu absent, or `ERR_NVGPUCTRPERM`), the driver runs again without
ncu under torch.profiler and the profile carries per-kernel timings only, with
`counters_available=False` and the reason.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness import ncu_parse
from kb_mcp.harness.problem import Problem, candidate_id
from kb_mcp.harness.profile_driver import EXIT_NO_GPU, NVTX_RANGE, DriverReport, DriverSpec, kernels_from_trace
from kb_mcp.harness.profile_model import Profile
from kb_mcp.harness.profile_standby import Standby, StandbyKey, StandbyPool, driver_args
from kb_mcp.kb.progress import Progress, no_progress


# Sections that speak to bottlenecks. WarpStateStats and SchedulerStats are only in `--set full`
# unless asked for by name; SourceCounters (SASS-level, extra passes) is opt-in.
SECTIONS = (
    "SpeedOfLight",
    "MemoryWorkloadAnalysis",
    "MemoryWorkloadAnalysis_Tables",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "SchedulerStats",
    "ComputeWorkloadAnalysis",
)
SOURCE_SECTIONS = ("SourceCounters",)
ENV_NCU = "KB_MCP_NCU"  # explicit ncu path; an empty value means "no ncu" (forces the fallback)
PERM_ERROR = "ERR_NVGPUCTRPERM"


class ProfileOptions(BaseModel):
    """How to profile; the defaults aim at a few seconds per candidate."""

    model_config = ConfigDict(extra="forbid")

    warmup: int = Field(2, ge=1, le=50, description="forward passes before the profiled one (outside the range)")
    counters: bool = Field(True, description="collect hardware counters with ncu; False gives timings only")
    source_counters: bool = Field(False, description="add the SourceCounters section (SASS-level; more passes)")
    max_kernels: int = Field(200, ge=1, le=5000, description="profile at most this many kernel launches")
    timeout_s: float = Field(300.0, gt=0, description="wall-clock limit of the profiling run")


class ProfilerError(RuntimeError):
    """Profiling failed for a reason the caller can act on (the message says which and what to do)."""


class NoGpuError(ProfilerError):
    """No CUDA device is visible: profiling needs one."""


@dataclass
class NcuRun:
    """One finished `ncu` run: exit status, combined output, and the passes per kernel it printed."""

    returncode: int
    output: str
    passes: list[int]
    timed_out: bool
    wall_s: float


def find_ncu() -> str | None:
    """Path of the ncu executable: $KB_MCP_NCU (empty = none), PATH, then the usual install folders."""
    if ENV_NCU in os.environ:
        value = os.environ[ENV_NCU].strip()
        return value if value and os.access(value, os.X_OK) else None
    found = shutil.which("ncu")
    if found:
        return found
    patterns = ("/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu")
    for pattern in patterns:
        for path in sorted(glob.glob(pattern), reverse=True):
            if os.access(path, os.X_OK):
                return path
    return None


def ncu_command(
    ncu: str,
    report_base: Path,
    target: Sequence[str],
    *,
    source_counters: bool = False,
    max_kernels: int = 200,
    metrics: Sequence[str] | None = None,
    nvtx: bool = True,
) -> list[str]:
    """The ncu command line that profiles `target` into `<report_base>.ncu-rep`."""
    cmd = [ncu]
    if nvtx:
        cmd += ["--nvtx", "--nvtx-include", f"{NVTX_RANGE}/"]
    for section in SECTIONS + (SOURCE_SECTIONS if source_counters else ()):
        cmd += ["--section", section]
    wanted = ncu_parse.requested_metrics() if metrics is None else list(metrics)
    if wanted:
        cmd += ["--metrics", ",".join(wanted)]
    cmd += [
        "--target-processes", "application-only",  # not the compilers a load_inline build spawns
        "--launch-count", str(max_kernels),
        "--export", str(report_base),
        "--force-overwrite",
    ]
    return cmd + list(target)


def export_commands(ncu: str, report: Path) -> tuple[list[str], list[str]]:
    """The two import commands: raw page (metrics) and details page (rule findings), base units."""
    common = [ncu, "--import", str(report), "--csv", "--print-units", "base"]
    return common + ["--page", "raw"], common + ["--page", "details"]


_PROFILING = re.compile(r'==PROF== Profiling "([^"]*)"')
_PASSES = re.compile(r"-\s*(\d+)\s+pass(?:es)?")


class NcuProcess:
    """A started ncu (or driver) process whose output is read as it comes, for progress and the log."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.start = time.perf_counter()
        # Its own session: a timeout kills ncu and the driver under it together.
        self.proc = subprocess.Popen(
            list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
            errors="replace", start_new_session=True,
        )
        self.lines: list[str] = []
        self.passes: list[int] = []
        self.progress: Progress = no_progress  # replaced by whoever waits for the result
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            match = _PROFILING.search(line)
            if match:
                found = _PASSES.search(line)
                if found:
                    self.passes.append(int(found.group(1)))
                self.progress(len(self.passes) + (0 if found else 1), None,
                              f"profiling kernel: {ncu_parse.short_name(match.group(1))}")

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kills the process group (ncu and the driver under it)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def finish(self, timeout_s: float, log_path: Path | None = None, progress: Progress = no_progress,
               since: float | None = None) -> NcuRun:
        """Waits for the process (killing it after `timeout_s`) and returns what it did.

        `since`: when the caller's request began (a standby process started long before it).
        """
        self.progress = progress
        begun = self.start if since is None else since
        timed_out = False
        try:
            self.proc.wait(timeout=max(0.0, timeout_s - (time.perf_counter() - begun)))
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill()
        self._reader.join(timeout=5)
        output = "".join(self.lines)
        if log_path is not None:
            log_path.write_text(output)
        return NcuRun(self.proc.returncode, output, list(self.passes), timed_out, time.perf_counter() - begun)


def run_ncu(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 300.0,
    log_path: Path | None = None,
    progress: Progress = no_progress,
) -> NcuRun:
    """Runs `cmd` (an ncu command), streaming its output to `progress`; kills the group on timeout."""
    return NcuProcess(cmd, env).finish(timeout_s, log_path, progress)


def export_pages(ncu: str, report: Path, timeout_s: float = 120.0) -> tuple[str, str]:
    """Raw and details CSV pages of a report (both imports run at once: each costs ncu's start-up)."""
    raw_cmd, details_cmd = export_commands(ncu, report)
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
             for c in (raw_cmd, details_cmd)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout_s)
        if proc.returncode != 0:
            raise ProfilerError(f"ncu could not read its own report {report}: {err.strip()[-500:]}")
        outputs.append(out)
    return outputs[0], outputs[1]


def counters_blocked_reason(output: str) -> str | None:
    """The reason counters are unavailable, if ncu's output says so."""
    if PERM_ERROR in output:
        return (
            f"{PERM_ERROR}: this user may not read the GPU performance counters (containers need "
            "--cap-add SYS_ADMIN, or the driver option NVreg_RestrictProfilingToAdminUsers=0); "
            "per-kernel timings only"
        )
    return None


def unknown_metrics(output: str, metrics: Sequence[str]) -> list[str]:
    """The requested metrics that ncu's error lines name (by full name or by base counter name)."""
    errors = "\n".join(line for line in output.splitlines() if "ERROR" in line or "metric" in line.lower())
    return [m for m in metrics if re.search(re.escape(m.split(".")[0]) + r"(?![A-Za-z0-9_])", errors)]


def profile_target(
    ncu: str,
    target: Sequence[str],
    report_base: Path,
    *,
    env: dict[str, str] | None,
    options: ProfileOptions,
    log_path: Path | None = None,
    progress: Progress = no_progress,
    metrics: Sequence[str] | None = None,
    first: NcuRun | None = None,
) -> tuple[NcuRun, list[str]]:
    """Runs `target` under ncu with the standard sections and `metrics` (default: all the parser reads).

    A metric that this ncu or GPU does not know fails the whole run, so such metrics are
    dropped (named in the second return value) and the run repeated, at most a few times.
    `first`: a run with these metrics that already happened (a standby driver's), checked first.
    """
    metrics = list(ncu_parse.requested_metrics() if metrics is None else metrics)
    dropped: list[str] = []
    for _ in range(6):
        if first is not None:
            run, first = first, None
        else:
            cmd = ncu_command(ncu, report_base, target, metrics=metrics,
                              source_counters=options.source_counters, max_kernels=options.max_kernels)
            run = run_ncu(cmd, env=env, timeout_s=options.timeout_s, log_path=log_path, progress=progress)
        if "Failed to find metric" not in run.output or run.timed_out:
            return run, dropped
        bad = unknown_metrics(run.output, metrics)
        if not bad:  # unknown which one: fall back to the sections' own metrics
            dropped.extend(metrics)
            metrics = []
        else:
            dropped.extend(bad)
            metrics = [m for m in metrics if m not in bad]
    return run, dropped


def _driver_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Reuse builds that compile_and_verify already made (same convention as the worker pool).
    env.setdefault("TORCH_EXTENSIONS_DIR", str(cache_dir / "torch_extensions"))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run_on_standby(
    standby: Standby, spec: DriverSpec, report: Path, options: ProfileOptions, log_path: Path, progress: Progress
) -> NcuRun | None:
    """Hands `spec` to a waiting driver and waits for ncu; None if the driver had gone meanwhile."""
    progress(0, None, "handing the model to the waiting profiler")
    handed = time.perf_counter()
    try:
        standby.hand_over(spec)
        process = cast(NcuProcess, standby.process)  # the pool holds what `standby_launcher` started
        run = process.finish(options.timeout_s, log_path, progress, since=handed)
        if not standby.claimed():
            return None  # it exited (idle or owner check) just before the spec arrived: run cold
        made = Path(str(standby.report_base) + ".ncu-rep")
        if made.is_file():
            shutil.move(str(made), report)
        return run
    finally:
        standby.close()


def standby_launcher(ncu: str, key: StandbyKey, pool: StandbyPool, env: dict[str, str]) -> Callable[[Path], NcuProcess]:
    """How the pool starts the next standby: the same ncu command line, the driver waiting in `folder`."""
    def launch(folder: Path) -> NcuProcess:
        target = [sys.executable, "-m", "kb_mcp.harness.profile_driver", *driver_args(folder, pool.idle_s)]
        cmd = ncu_command(ncu, folder / "report", target, metrics=list(key.metrics),
                          source_counters=key.source_counters, max_kernels=key.max_kernels)
        return NcuProcess(cmd, env)

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
    if returncode == EXIT_NO_GPU or report.stage == "device":
        raise NoGpuError("profiling needs a CUDA GPU, and none is visible on this machine")
    who = "the candidate" if candidate and report.stage != "load_problem" else "the problem's model"
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
) -> Profile:
    """Profiles one forward of `problem` (or of the candidate's ModelNew) and returns the Profile.

    The ncu report, if one is made, is kept at `<report_base>.ncu-rep`. With a `standby` pool the
    forward runs on a driver started after the previous profile (see `harness.profile_standby`),
    and a new one is started for the next profile.
    Raises NoGpuError without a GPU and ProfilerError when the model or candidate fails.
    """
    options = options or ProfileOptions()
    start = time.perf_counter()
    cand_id = candidate_id(problem, candidate_source) if candidate_source is not None else None
    with tempfile.TemporaryDirectory(prefix="kbmcp-profile-") as tmp:
        work = Path(tmp)
        spec = DriverSpec(
            problem_source=problem.source,
            problem_module=f"kbmcp_problem_{problem.hash}",
            candidate_source=candidate_source,
            candidate_module=f"kbmcp_{cand_id}" if cand_id else None,
            warmup=options.warmup,
            workdir=str(work / "src"),
            report_path=str(work / "driver.json"),
            trace_path=str(work / "trace.json"),
        )
        env = _driver_env(cache_dir)
        driver = [sys.executable, "-m", "kb_mcp.harness.profile_driver"]
        notes: list[str] = []
        reason: str | None = None
        ncu = find_ncu() if options.counters else None
        if not options.counters:
            reason = "counters not requested (counters=false): per-kernel timings only"
        elif ncu is None:
            reason = "ncu (Nsight Compute) was not found: per-kernel timings only; install Nsight Compute or set KB_MCP_NCU"

        if ncu is not None:
            spec_ncu = spec.model_copy(update={"mode": "ncu"})
            spec_path = work / "spec_ncu.json"
            spec_path.write_text(spec_ncu.model_dump_json())
            report = Path(str(report_base) + ".ncu-rep")
            report.parent.mkdir(parents=True, exist_ok=True)
            wanted = ncu_parse.requested_metrics()
            metrics = standby.metrics(wanted) if standby is not None else wanted
            key = StandbyKey(ncu, options.source_counters, options.max_kernels, tuple(metrics),
                             env.get("TORCH_EXTENSIONS_DIR", ""))
            waiting = standby.take(key) if standby is not None else None
            first = (_run_on_standby(waiting, spec_ncu, report, options, work / "ncu.log", progress)
                     if waiting is not None else None)
            if first is None:
                progress(0, None, "starting the model under Nsight Compute")
            run, dropped = profile_target(ncu, driver + [str(spec_path)], report_base, env=env, options=options,
                                          log_path=work / "ncu.log", progress=progress, metrics=metrics, first=first)
            if standby is not None:
                _prepare_next(standby, ncu, key, dropped, run, env)
            if run.timed_out:
                raise ProfilerError(f"profiling took longer than {options.timeout_s:.0f} s and was stopped; "
                                    "lower max_kernels or the problem size, or raise timeout_s")
            if dropped:
                notes.append(f"metrics unknown to this ncu/GPU were left out: {', '.join(dropped)}")
            reason = counters_blocked_reason(run.output)
            if reason is None:
                driver_report = _read_driver_report(Path(spec.report_path), run.returncode, run.output)
                _raise_for_driver(driver_report, run.returncode, candidate_source is not None)
                kernels = []
                phases = dict(driver_report.phases_s)
                phases["ncu_run"] = round(run.wall_s, 3)
                if report.is_file():
                    progress(len(run.passes), None, "reading the report")
                    t0 = time.perf_counter()
                    raw, details = export_pages(ncu, report)
                    kernels = ncu_parse.parse_ncu_csv(raw, details)
                    phases["export_and_parse"] = round(time.perf_counter() - t0, 3)
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
                                   report_file=str(report) if report.is_file() else None,
                                   wall_s=time.perf_counter() - start)
                result.phases_s = phases
                return result

        # Fallback: per-kernel timings from torch.profiler, no counters.
        spec_path = work / "spec_timeline.json"
        spec_path.write_text(spec.model_copy(update={"mode": "timeline"}).model_dump_json())
        progress(0, None, "timing kernels without counters")
        try:
            proc = subprocess.run(driver + [str(spec_path)], env=env, capture_output=True, text=True,
                                  errors="replace", timeout=options.timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise ProfilerError(f"the timing run took longer than {options.timeout_s:.0f} s and was stopped") from exc
        driver_report = _read_driver_report(Path(spec.report_path), proc.returncode, proc.stdout + proc.stderr)
        _raise_for_driver(driver_report, proc.returncode, candidate_source is not None)
        trace = json.loads(Path(driver_report.trace_path or spec.trace_path or "").read_text())
        kernels = kernels_from_trace(trace)
        result = _assemble(profile_id, problem, cand_id, driver_report, kernels, notes,
                           report_file=None, wall_s=time.perf_counter() - start)
        result.counters_available = False
        result.counters_reason = reason
        result.method = "timeline"
        result.phases_s = dict(driver_report.phases_s)
        return result


def _prepare_next(pool: StandbyPool, ncu: str, key: StandbyKey, dropped: list[str], run: NcuRun,
                  env: dict[str, str]) -> None:
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
    pool.launch(key, standby_launcher(ncu, key, pool, env))


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
