"""The verification pipeline a GPU worker runs on one candidate (worker side; imports torch).

Static checks, import (builds recorded), construction with a secret weight seed, then the input
sets and checks (`harness.worker.checks`: one set from a public seed (a cheat may guess it), at
least five from secret seeds drawn with `os.urandom` only when each set is made, any user seeds,
and one of a different distribution). A candidate that passed everything then waits for the
kernel census, which the pool takes in its census worker (`harness.worker.census`: this process
never starts a profiler session, so that its timings are those of a clean process). Then the
reference's seal (`harness.worker.seal`: the reference must be as the problem defines it, since it
is timed here too), timing (see `harness.worker.timing`; eager interleaved with the candidate where
it is timed anew: the first measurement, and a launch-bound reference every time), baselines
(`harness.baselines`; a new one goes back to the server, which keeps the cache) and the verdict
(`harness.verdict.decide`).

The problem is imported, its `Model` built and one input set made before any candidate code runs:
a failure there is the problem's (`protocol.ProblemFailed`), never the candidate's crash.
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
from kb_mcp.harness.problem import Problem
from kb_mcp.harness.protocol import CensusReply, ProblemFailed
from kb_mcp.harness.verdict import (
    CompileResult,
    Finding,
    FindingCode,
    InputSetCheck,
    Timings,
    VerifyOptions,
    VerifyResult,
    decide,
)
from kb_mcp.harness.worker.checks import Checker, Stop
from kb_mcp.harness.worker.compile import Builders
from kb_mcp.harness.worker.evidence import escalate
from kb_mcp.harness.worker.integrity import IntegrityGuard, dedupe
from kb_mcp.harness.worker.integrity_runtime import TrustedSnapshot
from kb_mcp.harness.worker.loading import load_module, short_traceback
from kb_mcp.harness.worker.seal import ReferenceSeal
from kb_mcp.harness.worker.timing import Timer, guards_active
from kb_mcp.harness.worker.values import secret_seed
from kb_mcp.kb.models import Verdict


@dataclass
class WorkerEnv:
    """What a worker sets up once: device facts, builders, the trusted snapshot and the timer."""

    cache_dir: Path  # the shared cache: read-only inside the sandbox
    scratch: Path  # this worker's writable folder
    cuda: bool
    device: str = ""
    arch: str = ""
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


class ProblemBroken(Exception):
    """The problem's own code failed before any candidate code ran."""

    def __init__(self, stage: str, exc: BaseException, files: tuple[str, ...] = ()) -> None:
        super().__init__(stage)
        self.failure = ProblemFailed(stage=stage, error=short_traceback(exc, files))


def _is_cuda_error(exc: BaseException) -> bool:
    name = type(exc).__name__
    text = str(exc)
    return name in ("AcceleratorError", "CudaError") or "CUDA error" in text or "cudaError" in text


def _context_healthy() -> bool:
    try:
        torch.cuda.synchronize()
        x = torch.ones(8, device="cuda")
        return float((x + 1).sum().item()) == 16.0
    except Exception:  # noqa: BLE001 - any CUDA failure means the context is unusable
        return False


class GpuVerification:
    """Verification of one candidate on the GPU; `run()` returns (result, retire_worker)."""

    def __init__(self, env: WorkerEnv, problem: Problem, source: str, options: VerifyOptions,
                 candidate_id: str, report: Callable[[str], None], ask_census: Callable[..., CensusReply]) -> None:
        """`ask_census()` returns the census worker's `CensusReply` for this candidate: the worker
        asks the pool for it after the checks and waits, so no census overlaps the timing;
        `ask_census(counters=True)` returns the work census of an escalated result (`evidence`)."""
        self.env = env
        self.ask_census = ask_census
        self.problem = problem
        self.source = source
        self.options = options
        self.candidate_id = candidate_id
        self.report = report
        self.findings: list[Finding] = []
        self.sets: list[InputSetCheck] = []
        self.files: tuple[str, ...] = ()
        self.loosened = ""
        self.tolerance: dict[str, float] = {}
        self.t0 = time.perf_counter()
        self.phase = "static"
        self.modules: list[str] = []
        self.new_baseline: Baseline | None = None  # measured here for the cache (the server stores it)

    # -- plumbing ------------------------------------------------------------------------------

    def _phase(self, name: str) -> None:
        self.phase = name
        self.report(name)

    def _result(self, verdict: Verdict, summary: str, compile: CompileResult, flagged: bool = False,
                timings: Timings | None = None) -> VerifyResult:
        env = self.env
        return VerifyResult(
            candidate_id=self.candidate_id, problem=self.problem.name, problem_hash=self.problem.hash,
            verdict=verdict, summary=summary, flagged=flagged, compile=compile, input_sets=self.sets,
            findings=dedupe(self.findings), timings=timings, tolerance=self.tolerance, device=env.device,
            arch=env.arch, torch_version=env.torch_version, phase=self.phase, loosened=self.loosened,
            elapsed_s=round(time.perf_counter() - self.t0, 3),
        )

    def _compile_result(self) -> CompileResult:
        assert self.env.builders is not None
        return self.env.builders.result()

    def _failure(self, exc: BaseException, what: str) -> Stop:
        """Turns an exception from candidate code into a Stop with the right verdict."""
        comp = self._compile_result()
        if not comp.ok:
            return Stop(Verdict.compile_error,
                        f"compile error: {comp.messages[0] if comp.messages else 'build failed'}")
        if isinstance(exc, SyntaxError):
            return Stop(Verdict.compile_error, f"compile error: Python syntax error at line {exc.lineno}: {exc.msg}")
        if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc):
            torch.cuda.empty_cache()
            return Stop(Verdict.crashed,
                        f"crashed: {what} ran out of GPU memory: {str(exc).strip().splitlines()[0][:300]}")
        if _is_cuda_error(exc):
            healthy = _context_healthy()
            state = "the CUDA context survived" if healthy else "the CUDA context is corrupted; worker replaced"
            # Even a context that still answers may hold the candidate's stray state: replace the worker.
            return Stop(Verdict.crashed, f"crashed: {what} raised a CUDA error ({state}): "
                        f"{str(exc).strip().splitlines()[0][:300]}", retire=True)
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            return Stop(Verdict.crashed, f"crashed: {what} tried to exit the worker ({type(exc).__name__})",
                        retire=True)
        return Stop(Verdict.crashed, f"crashed: {what} raised {short_traceback(exc, self.files)}",
                    retire=not _context_healthy())

    def _load(self, source: str, stem: str) -> Any:
        name = f"{stem}_{next(self.env.counter)}"
        self.modules.append(name)
        return load_module(source, name, self.env.workdir)

    def cleanup(self) -> None:
        """Drops the modules this verification imported (fresh namespace for the next one)."""
        for name in self.modules:
            sys.modules.pop(name, None)
        gc.collect()
        if self.env.cuda:
            torch.cuda.empty_cache()

    # -- the pipeline --------------------------------------------------------------------------

    def _census(self, guard: IntegrityGuard) -> None:
        """Which kernels one forward launches, from the census worker (see `harness.census`)."""
        from kb_mcp.harness.worker.integrity_runtime import KernelCensus

        self._phase("census")
        reply = self.ask_census()
        self.findings += reply.findings
        if reply.census is not None:
            guard.last_census = KernelCensus.model_validate(reply.census)
        if reply.verdict is not None:
            raise Stop(reply.verdict, reply.summary)

    def run(self) -> tuple[VerifyResult | ProblemFailed, bool]:
        """The whole pipeline; never raises for candidate misbehaviour. A problem that fails before
        the candidate runs gives ProblemFailed (and a fresh worker: the problem's code ran here)."""
        try:
            result, retire = self._run()
        except ProblemBroken as broken:
            self.cleanup()
            return broken.failure, True
        except Stop as stop:
            result, retire = self._result(stop.verdict, stop.summary, self._compile_result()), stop.retire
        finally:
            self.cleanup()
        # Whatever is left active (a mode, a trace function) would slow the next candidate's timed
        # runs and baselines: the next candidate gets a clean process instead.
        return result, retire or bool(self.env.new_guards())

    def _reference(self) -> tuple[Any, torch.nn.Module, list[Any], int]:
        """The problem imported, its Model built (weights from a secret seed) and one input set made,
        before any candidate code runs: (module, reference, init inputs, weight seed)."""
        try:
            pmod = self._load(self.problem.source, "kbmcp_problem")
        except Exception as exc:
            raise ProblemBroken("import", exc, (str(self.env.workdir / f"{self.modules[-1]}.py"),)) from exc
        files = (str(getattr(pmod, "__file__", "")),)
        seed = secret_seed()
        try:
            init = [x.cuda() if isinstance(x, torch.Tensor) else x for x in pmod.get_init_inputs()]
            torch.manual_seed(seed)
            ref = pmod.Model(*init).cuda().eval()
        except Exception as exc:
            raise ProblemBroken("construct", exc, files) from exc
        try:
            torch.manual_seed(secret_seed())
            with torch.device("cuda"):
                pmod.get_inputs()
        except Exception as exc:
            raise ProblemBroken("inputs", exc, files) from exc
        return pmod, ref, init, seed

    def _run(self) -> tuple[VerifyResult, bool]:
        env, opts = self.env, self.options
        assert env.builders is not None and env.timer is not None
        env.builders.reset()
        guard = IntegrityGuard(allow=opts.allow, trusted=env.snapshot)
        self._phase("static")
        self.findings += guard.check_source(self.source)

        self._phase("import")
        pmod, ref, init, seed = self._reference()
        seal = ReferenceSeal.of_problem(pmod)  # before the candidate's code runs
        seal.seal_instance(ref)
        try:
            with guard.watch_setup():
                cmod = self._load(self.source, "kbmcp_candidate")
        except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything
            self.files = (str(self.env.workdir / f"{self.modules[-1]}.py"),)
            raise self._failure(exc, "importing the candidate") from None
        self.files = (str(getattr(cmod, "__file__", "")),)
        model_new = getattr(cmod, "ModelNew", None)
        if not isinstance(model_new, type):
            raise Stop(Verdict.compile_error, "compile error: the candidate defines no class ModelNew")

        self._phase("construct")
        try:
            with guard.watch_setup():
                torch.manual_seed(seed)
                cand = model_new(*init).cuda().eval()
        except BaseException as exc:  # noqa: BLE001
            raise self._failure(exc, "constructing ModelNew") from None
        torch.manual_seed(secret_seed())
        self.findings += guard.attach(cmod, cand, reference=pmod.Model)

        self._phase("check")
        checker = Checker(self, pmod, ref, cand, guard)
        with torch.no_grad():
            checker.run_sets()
        self.findings += guard.findings()
        comp = self._compile_result()
        retire = IntegrityGuard.retire_worker(self.findings)
        # `decide` without timings says needs_gpu when nothing is wrong yet; anything else ends here.
        verdict, flagged, summary = decide(comp, self.sets, self.findings, None, gpu=False, loosened=self.loosened)
        if verdict != Verdict.needs_gpu:  # failed to build, invalid or incorrect: no timing
            return self._result(verdict, summary, comp, flagged), retire

        self._census(guard)
        self.findings += guard.findings()
        verdict, flagged, summary = decide(comp, self.sets, self.findings, None, gpu=False, loosened=self.loosened)
        if verdict != Verdict.needs_gpu:  # library kernels, no kernel of its own, or the census worker saw a cheat
            return self._result(verdict, summary, comp, flagged), retire

        left = env.new_guards()
        if left:
            # Checked before timing: a mode or trace function left behind by the candidate would
            # slow every call timed in this process, the baselines' included.
            self.findings.append(Finding(
                code=FindingCode.harness_tampering,
                message=(f"after the candidate ran, {', '.join(left)} stayed active in the harness's process; that "
                         "slows every call timed there (the reference's too). Leave dispatch and function modes, "
                         "trace functions and the profiler as they were"),
            ))
            verdict, flagged, summary = decide(comp, self.sets, self.findings, None, gpu=False, loosened=self.loosened)
            return self._result(verdict, summary, comp, flagged), True
        changed = seal.changes(pmod, ref)
        if changed:
            # The reference is timed in this process next (beside the candidate, or for the cache).
            self.findings.append(Finding(
                code=FindingCode.harness_tampering,
                message=(f"the reference changed after the problem was loaded ({'; '.join(changed[:4])}); it is "
                         "timed in this process, so a slowed reference would fake a speedup. Leave the problem's "
                         "module and its Model alone"),
            ))
            verdict, flagged, summary = decide(comp, self.sets, self.findings, None, gpu=False, loosened=self.loosened)
            return self._result(verdict, summary, comp, flagged), True

        self._phase("timing")
        base = env.baselines.get(self.problem.hash, env.device, env.torch_version, need_compile=opts.compile_baseline)
        with torch.no_grad():
            stats, eager = checker.time_candidate(base)
        if stats.errors:
            self.findings.append(Finding(
                code=FindingCode.timed_output_mismatch, source="timing",
                message=(f"{len(stats.errors)} of {len(stats.gpu_ms)} timed runs returned wrong outputs "
                         f"({stats.errors[0]}) although the checked runs were correct; every call must compute "
                         "its result"),
            ))
        unsync = env.timer.unsynchronized(stats)
        if unsync:
            self.findings.append(Finding(code=FindingCode.unsynchronized_work, message=unsync, source="timing"))
        self.findings += guard.findings()
        retire = IntegrityGuard.retire_worker(self.findings)
        verdict, flagged, summary = decide(comp, self.sets, self.findings, None, gpu=False, loosened=self.loosened)
        if verdict != Verdict.needs_gpu:
            return self._result(verdict, summary, comp, flagged), retire

        self._phase("baselines")
        with torch.no_grad():
            timings = checker.timings(stats, eager, base)
        if not timings.baseline_cached:
            # A first torch.compile installs patches of its own (e.g. on nn.Module.__init__). The
            # candidate was checked against the pristine snapshot above; the next one is checked
            # against the state the trusted baseline left.
            env.snapshot = TrustedSnapshot.capture()
        # A result that looks too good gets more evidence, which accepts or rejects it (`evidence`).
        self.findings += escalate(self, checker, timings)
        self.findings += guard.findings()
        retire = retire or IntegrityGuard.retire_worker(self.findings)
        verdict, flagged, summary = decide(comp, self.sets, self.findings, timings, gpu=True, loosened=self.loosened)
        return self._result(verdict, summary, comp, flagged, timings), retire
