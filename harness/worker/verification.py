"""One verification's state on the worker side, and its plumbing (worker side; imports torch).

What a worker sets up once (`WorkerEnv`), what a stage returns (`Found`) and what a stage is
(`Stage`), and `Verification`: the state the stages of `harness.worker.verify.GpuVerification` share
(the evidence, the modules imported, the memory taken, whose fault an exception is) with what they
record into and the steps around them (phases, the result, the memory report, cleaning up).
"""

from __future__ import annotations

import gc
import itertools
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kb_mcp.harness.baselines import Baseline, BaselineCache
from kb_mcp.harness.gpu.memory import Footprint, MemoryPlan, MemoryReport
from kb_mcp.harness.judgment.composed import COMPOSED, coverage_note
from kb_mcp.harness.judgment.verdict import (
    Evidence,
    Failure,
    Finding,
    Judgement,
    Timings,
    VerifyOptions,
    VerifyResult,
)
from kb_mcp.harness.problem import Problem
from kb_mcp.harness.protocol import CensusReply
from kb_mcp.harness.worker.checks import Checker, Halted
from kb_mcp.harness.worker.compile import Builders
from kb_mcp.harness.worker.fault import Blame
from kb_mcp.harness.worker.footprint import request_peak
from kb_mcp.harness.worker.integrity import IntegrityGuard, dedupe
from kb_mcp.harness.worker.integrity_runtime import TrustedSnapshot
from kb_mcp.harness.worker.loading import load_module
from kb_mcp.harness.worker.run_stats import RunStats
from kb_mcp.harness.worker.seal import ReferenceSeal
from kb_mcp.harness.worker.timing import Timer, guards_active


@dataclass
class WorkerEnv:
    """What a worker sets up once: device facts, builders, the trusted snapshot and the timer."""

    cache_dir: Path  # the shared cache: read-only inside the sandbox
    scratch: Path  # this worker's writable folder
    cuda: bool
    device: str = ""
    arch: str = ""
    uuid: str = ""  # the GPU's UUID (`GPU-...`), where torch reports it
    torch_version: str = torch.__version__
    snapshot: TrustedSnapshot | None = None
    builders: Builders | None = None
    timer: Timer | None = None
    props: Any = None
    counter: itertools.count = field(default_factory=itertools.count)
    role: str = "verify"  # verify: checks and times candidates (never profiles); census: kernel census only
    start_guards: tuple[str, ...] = ()  # `timing.guards_active()` when the worker started (normally none)

    @property
    def workdir(self) -> Path:
        """Where the current request's user code is written and imported from (emptied after it)."""
        return self.scratch / "work"

    def clean_workdir(self) -> None:
        """Removes the request's files: the next candidate in this worker must not read them."""
        shutil.rmtree(self.workdir, ignore_errors=True)

    def new_guards(self) -> list[str]:
        """Guards active now that were not when the worker started (see `timing.guards_active`)."""
        return [g for g in guards_active() if g not in self.start_guards]

    @property
    def baselines(self) -> BaselineCache:
        """The baseline cache under the cache dir (read here; the server writes it)."""
        return BaselineCache(self.cache_dir)



@dataclass
class Found:
    """What one stage returns: its findings, a failure that ends the run, the timings (the last
    stage), and whether the worker must be replaced afterwards (None: as before)."""

    findings: list[Finding] = field(default_factory=list)
    failure: Failure | None = None
    timings: Timings | None = None
    retire: bool | None = None


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline: the phase it reports (None: still the previous one), the step,
    and whether the verdict may be settled after it (`Judgement.settled` ends the run there)."""

    phase: str | None
    run: Callable[[], Found]
    gate: bool = False

    @property
    def name(self) -> str:
        """The step's name ("check", "timing", ...), as reports show it."""
        return str(getattr(self.run, "__name__", "stage")).lstrip("_")



class Verification:
    """The state of one candidate's verification and its plumbing; `GpuVerification` runs its stages."""

    def __init__(self, env: WorkerEnv, problem: Problem, source: str, options: VerifyOptions,
                 candidate_id: str, report: Callable[[str], None], ask_census: Callable[..., CensusReply],
                 baseline: Baseline | None = None) -> None:
        """`baseline` is the pool's (timed before the candidate in a worker no candidate ran in).
        `ask_census(units=...)` returns the census worker's `CensusReply` for this candidate (with
        the server's reading of the SASS of the candidate's builds `units`): the worker asks the pool
        for it after the checks and waits, so no census overlaps the timing; `ask_census(counters=True)`
        returns the work census of an escalated result (`evidence`)."""
        self.env = env
        self.ask_census = ask_census
        self.given_baseline = baseline
        self.problem = problem
        self.source = source
        self.options = options
        self.candidate_id = candidate_id
        self.report = report
        self.evidence = Evidence()
        self.retire = False
        self.tolerance: dict[str, float] = {}
        self.t0 = time.perf_counter()
        self.phase = "static"
        self.modules: list[str] = []
        self.new_baseline: Baseline | None = None  # measured here for the cache (the server stores it)
        self.composed = options.mode == COMPOSED  # the reference's own ops allowed (`harness.judgment.composed`)
        self.new_reference_ops: list[str] | None = None  # recorded here: sent back for the cache
        self.coverage: float | None = None  # the share of its GPU time in its own kernels (`kernels.coverage`)
        # Set by the stages as they go (the problem, its reference, the candidate, the checker):
        self.guard: IntegrityGuard | None = None
        self.pmod: Any = None
        self.ref: Any = None
        self.init: list[Any] = []
        self.seed = 0
        self.seal: ReferenceSeal | None = None
        self.cmod: Any = None
        self.cand: Any = None
        self.checker: Checker | None = None
        self.base: Baseline | None = None
        self.stats: RunStats | None = None
        self.eager: RunStats | None = None
        self.census: CensusReply | None = None  # the census worker's answer (with the device times)
        self.footprint = Footprint()  # measured on the meta device as the problem is loaded (`_reference`)
        self.plan = MemoryPlan()
        self.peaks: list[int] = []  # allocator peaks carried across resets (`footprint.PeakMeter`)
        self.stage_peaks: dict[str, int] = {}  # each stage's own (`MemoryReport.stage_peak_bytes`)
        # Whose fault an exception is once the candidate's code ran (`fault.Blame`), with what it
        # needs to know: the candidate's file, the problem's, and the GPU memory each may hold.
        self.input_bytes = 0  # one input set of the problem
        self.blame = Blame(lambda: self._compile_result().ok)
        self.blame.set_bytes = lambda: max(self.input_bytes, self.checker.io_bytes if self.checker is not None else 0)
        self.blame.release = self._release

    # -- what the checker records into -------------------------------------------------------

    @property
    def findings(self) -> list[Finding]:
        """The findings so far (the checker appends to them)."""
        return self.evidence.findings

    @property
    def sets(self) -> list[Any]:
        """The input sets checked so far (the checker appends to them)."""
        return self.evidence.input_sets

    @property
    def loosened(self) -> str:
        return self.evidence.loosened

    @loosened.setter
    def loosened(self, note: str) -> None:
        self.evidence.loosened = note

    # -- plumbing ------------------------------------------------------------------------------

    def _phase(self, name: str) -> None:
        self.phase = name
        self.report(name)

    def renew(self) -> None:
        """The current phase reported again, at an input set's boundary: the pool's limit for it
        restarts there, so each input set of the checks has the whole limit with the harness's own
        work on it (a 16 GiB set's pristine copy to the host and its comparisons back take seconds
        each, ten sets of them more than the candidate's limit for the whole phase)."""
        self.report(self.phase)

    def _result(self, judgement: Judgement) -> VerifyResult:
        env, e = self.env, self.evidence
        valid = self.composed and judgement.verdict.is_valid
        summary = judgement.summary + (f"; {coverage_note(self.coverage)}" if valid else "")
        return VerifyResult(
            candidate_id=self.candidate_id, problem=self.problem.name, problem_hash=self.problem.hash,
            verdict=judgement.verdict, summary=summary, mode=self.options.mode, coverage=self.coverage,
            flagged=judgement.flagged, compile=e.compile,
            input_sets=e.input_sets, findings=dedupe(e.findings), timings=e.timings, tolerance=self.tolerance,
            device=env.device, arch=env.arch, torch_version=env.torch_version, phase=self.phase,
            loosened=e.loosened, elapsed_s=round(time.perf_counter() - self.t0, 3), track=self.options.track,
            memory=self.memory_report(),
            not_judged=judgement.summary if judgement.not_judged else "",
            precision=e.precision,
        )

    def memory_report(self) -> MemoryReport | None:
        """The footprint, the plan and the peaks this verification took (the device's is the pool's to add)."""
        if not self.env.cuda:
            return None
        census = self.census.peak_bytes if self.census is not None else None
        return MemoryReport(footprint=self.footprint, plan=self.plan, verify_peak_bytes=request_peak(self.peaks),
                            census_peak_bytes=census, stage_peak_bytes=dict(self.stage_peaks),
                            set_peaks=list(self.checker.set_peaks) if self.checker is not None else [])

    def _compile_result(self) -> Any:
        assert self.env.builders is not None
        return self.env.builders.result()

    def _failure(self, exc: BaseException, what: str) -> Halted:
        """What an exception raised while the candidate's code ran (`what`) is evidence of: the one
        decision of `fault.Blame`, used where the harness calls the candidate itself."""
        return self.blame.inside(exc, what)

    def _load(self, source: str, stem: str) -> Any:
        name = f"{stem}_{next(self.env.counter)}"
        self.modules.append(name)
        return load_module(source, name, self.env.workdir)

    def _release(self) -> None:
        """Lets go of what the harness keeps across input sets (the reference outputs), so that what
        is left allocated after a failed step is the reference's and the candidate's own."""
        if self.checker is not None:
            self.checker.alive.clear()

    def cleanup(self) -> None:
        """Drops the modules this verification imported (fresh namespace for the next one). A CUDA
        context the candidate broke fails here too: the worker is then replaced."""
        for name in self.modules:
            sys.modules.pop(name, None)
        # What this verification held goes with it; whatever the candidate's code still keeps alive
        # after that (a class-level cache, a global) would shrink the next candidate's GPU.
        self.cand = self.cmod = self.checker = None
        gc.collect()
        if self.env.cuda:
            try:
                torch.cuda.empty_cache()
                if self.blame.still_held() > self.blame.share:
                    self.retire = True
            except Exception:  # noqa: BLE001 - a broken context: the verdict already says why
                self.retire = True
