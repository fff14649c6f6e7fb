"""Nsight Compute run in the sandbox: finding ncu, its command lines (the sections and metrics a profile
collects), its processes (role `driver`, output read as it comes for progress and the log), the export
of its report's CSV pages, and a run repeated without the metrics this ncu or GPU does not know.
`profiling.profiler` profiles a forward with them; `profiling.work` takes the work census."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness.protocol import NVTX_RANGE
from kb_mcp.harness.sandbox.sandbox import Grant, Sandbox, kill_group
from kb_mcp.harness.sandbox.scratch import new_scratch
from kb_mcp.harness.sandbox.waiting import BoundedText, drain
from kb_mcp.kb.progress import Progress, no_progress
from kb_mcp.profiling import ncu_parse
from kb_mcp.profiling.ncu_parse import unknown_metrics

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
    sections: Sequence[str] | None = None,
) -> list[str]:
    """The ncu command line that profiles `target` into `<report_base>.ncu-rep`.

    `sections`: the sections to collect (default: `SECTIONS`, plus `SOURCE_SECTIONS` with
    `source_counters`); `()` collects the `metrics` alone."""
    cmd = [ncu]
    if nvtx:
        cmd += ["--nvtx", "--nvtx-include", f"{NVTX_RANGE}/"]
    if sections is None:
        sections = SECTIONS + (SOURCE_SECTIONS if source_counters else ())
    for section in sections:
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


class Spawner:
    """Starts ncu and the driver (and ncu's report export) in the sandbox, role `driver`."""

    def __init__(self, sandbox: Sandbox, cache_dir: Path | None, ncu: str | None) -> None:
        self.sandbox = sandbox
        self.cache_dir = cache_dir  # None: no published builds to read (a report export)
        self.ncu = ncu

    def grant(self, scratch: Path, role: str = "driver", ro: Sequence[Path] = ()) -> Grant:
        """What a process of this profile gets: its scratch, the GPU, published builds and ncu's install."""
        extra = [*([self.cache_dir / "torch_extensions"] if self.cache_dir else []), *ro]
        if self.ncu:
            extra.append(Path(os.path.realpath(self.ncu)).parent)
        return Grant(role=role, scratch=scratch, gpu=role == "driver", ro=tuple(extra))  # type: ignore[arg-type]

    def process(self, cmd: Sequence[str], scratch: Path) -> NcuProcess:
        """ncu (or the driver alone) started in the sandbox, its output read as it comes."""
        return NcuProcess(cmd, self.sandbox, self.grant(scratch))


class NcuProcess:
    """A started ncu (or driver) process whose output is read as it comes, for progress and the log."""

    def __init__(self, cmd: Sequence[str], sandbox: Sandbox, grant: Grant) -> None:
        self.start = time.perf_counter()
        # Its own session: a timeout kills ncu and the driver under it together.
        self.proc = sandbox.popen(list(cmd), grant, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output = BoundedText()  # what it printed, within a bound (the driver runs a candidate's code)
        self.passes: list[int] = []
        self.progress: Progress = no_progress  # replaced by whoever waits for the result
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        drain(self.proc.stdout, self.output, self._progress_of)

    def _progress_of(self, line: str) -> None:
        """Progress from one line of ncu's output (the kernel it profiles, the pass it is on)."""
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
        kill_group(self.proc)
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
        output = self.output.text
        if log_path is not None:
            log_path.write_text(output)
        return NcuRun(self.proc.returncode, output, list(self.passes), timed_out, time.perf_counter() - begun)


def run_ncu(
    cmd: Sequence[str],
    spawner: Spawner,
    scratch: Path,
    *,
    timeout_s: float = 300.0,
    log_path: Path | None = None,
    progress: Progress = no_progress,
) -> NcuRun:
    """Runs `cmd` (an ncu command) in the sandbox, streaming its output to `progress`; kills the
    group on timeout."""
    return spawner.process(cmd, scratch).finish(timeout_s, log_path, progress)


def export_pages(ncu: str, report: Path, spawner: Spawner, timeout_s: float = 120.0) -> tuple[str, str]:
    """Raw and details CSV pages of a report (both imports run at once: each costs ncu's start-up).
    The report was written inside the sandbox, so it is read there too."""
    raw_cmd, details_cmd = export_commands(ncu, report)
    scratches = [new_scratch("ncu-export") for _ in range(2)]
    procs = [spawner.sandbox.popen(c, spawner.grant(scratch, role="tool", ro=(report,)), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
             for c, scratch in zip((raw_cmd, details_cmd), scratches)]
    outputs = []
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise ProfilerError(f"ncu did not export its report {report} within {timeout_s:.0f} s") from None
            if proc.returncode != 0:
                raise ProfilerError(f"ncu could not read its own report {report}: {err.strip()[-500:]}")
            outputs.append(out)
    finally:
        for proc in procs:
            kill_group(proc)
        for scratch in scratches:
            shutil.rmtree(scratch, ignore_errors=True)
    return outputs[0], outputs[1]


def profile_target(
    ncu: str,
    target: Sequence[str],
    report_base: Path,
    *,
    spawner: Spawner,
    scratch: Path,
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
            run = run_ncu(cmd, spawner, scratch, timeout_s=options.timeout_s, log_path=log_path, progress=progress)
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

