"""The verification pipeline a GPU worker runs on one candidate (worker side; imports torch).

Static checks, import (builds recorded), construction with a secret weight seed, then the input
sets and checks (`harness.worker.checks`: one set from a public seed (a cheat may guess it), at
least five from secret seeds drawn with `os.urandom` only when each set is made, any user seeds,
and one of a different distribution). A candidate that passed everything then waits for the
kernel census, which the pool takes in its census worker (`harness.worker.census`: this process
never starts a profiler session, so that its timings are those of a clean process), with the
server's reading of the SASS of its builds (`harness.judgment.precision`); kernels that compute on the tensor
cores below the track's precision then get the precision probes (`harness.worker.probes`), whose
numbers decide. Then the guards left active, the
reference's seal (`harness.worker.seal`: the reference must be as the problem defines it, since it
is timed here too), timing (see `harness.worker.timing`; eager interleaved with the candidate where
it is timed anew: the first measurement, and a launch-bound reference every time) and baselines
(`harness.baselines`; a new one goes back to the server, which keeps the cache).

The verification is a list of stages (`GpuVerification.stages`; the state they share and the steps
around them in `harness.worker.verification`). Each returns what it found as a
`Found` (findings, a `verdict.Failure` that ends the run, the timings, whether the worker must be
replaced); the evidence is collected in one `verdict.Evidence`, and `verdict.judge` alone turns it
into the verdict. After a gated stage the pipeline asks `judge` whether the verdict is already
settled (a failure, a cheat, a wrong answer) and then stops; no stage decides a verdict itself.
All stages run in the numerics of the request's precision track (`harness.worker.tracks`).

The problem is imported, its `Model` built and one input set made before any candidate code runs:
a failure there is the problem's (`protocol.ProblemFailed`), never the candidate's crash. Once the
candidate's code ran, an exception a stage lets out is sorted in one place (`fault.Blame.halt`,
called by the stage loop): the candidate's (its own code on the stack, any CUDA error, running out
of memory while it holds more than its share), the problem's, the machine's (out of memory through
no fault of the candidate's: no verdict), or a defect of ours, which the worker reports as such.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kb_mcp.harness.gpu.memory import Footprint, TooLarge, plan
from kb_mcp.harness.judgment.kernels import coverage
from kb_mcp.harness.judgment.precision import precision_check, precision_findings
from kb_mcp.harness.judgment.verdict import (
    Failure,
    FailureKind,
    Finding,
    FindingCode,
    VerifyResult,
    judge,
)
from kb_mcp.harness.phases import PHASE_WORDS
from kb_mcp.harness.protocol import ProblemFailed
from kb_mcp.harness.worker.checks import Checker, Halted
from kb_mcp.harness.worker.evidence import escalate
from kb_mcp.harness.worker.fault import ProblemBroken, tensor_bytes
from kb_mcp.harness.worker.footprint import device_free, measure, start_request
from kb_mcp.harness.worker.integrity import IntegrityGuard
from kb_mcp.harness.worker.integrity_runtime import TrustedSnapshot
from kb_mcp.harness.worker.loading import with_model_weights
from kb_mcp.harness.worker.ops import reference_dispatch_ops
from kb_mcp.harness.worker.probes import run_probes
from kb_mcp.harness.worker.seal import ReferenceSeal
from kb_mcp.harness.worker.tracks import numerics, strict_numerics, track_numerics
from kb_mcp.harness.worker.values import secret_seed
from kb_mcp.harness.worker.verification import Found, Stage, Verification, WorkerEnv

__all__ = ["Found", "GpuVerification", "Stage", "WorkerEnv", "too_large_now"]


def _oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)


def too_large_now(footprint: Footprint, what: str = "eager") -> TooLarge:
    """The refusal when the problem's own allocations ran out of memory: the numbers as they are now."""
    torch.cuda.empty_cache()
    free, total = device_free()
    return TooLarge(what=what, needed_bytes=footprint.eager_bytes, free_bytes=free, total_bytes=total,
                    footprint=footprint)


class GpuVerification(Verification):
    """Verification of one candidate on the GPU; `run()` returns (result, retire_worker)."""

    # -- the pipeline --------------------------------------------------------------------------

    def run(self) -> tuple[VerifyResult | ProblemFailed, bool]:
        """The whole pipeline, in the request's precision track; never raises for candidate
        misbehaviour. A problem that fails before the candidate runs gives ProblemFailed (and a
        fresh worker: the problem's code ran here)."""
        if self.env.cuda:
            start_request(self.peaks)
        try:
            with track_numerics(self.options.track, self.env.snapshot) as snapshot:
                result = self._run(snapshot)
        except ProblemBroken as broken:
            return broken.failure, True
        finally:
            # its own phase, so that what freeing the verification's memory costs is not the last stage's
            self._phase("finish")
            self.cleanup()
        # Whatever is left active (a mode, a trace function) would slow the next candidate's timed
        # runs and baselines: the next candidate gets a clean process instead.
        return result, self.retire or bool(self.env.new_guards())

    def stages(self) -> list[Stage]:
        """The stages in order (see the module's docstring)."""
        return [
            Stage("static", self._static), Stage("import", self._reference), Stage(None, self._candidate),
            Stage("construct", self._construct), Stage("check", self._check, gate=True),
            Stage("census", self._census, gate=True), Stage("probes", self._probes, gate=True),
            Stage(None, self._leftovers, gate=True),
            Stage(None, self._sealed, gate=True), Stage("timing", self._timing, gate=True),
            Stage("baselines", self._baselines),
        ]

    def _run(self, snapshot: TrustedSnapshot | None) -> VerifyResult:
        env = self.env
        assert env.builders is not None and env.timer is not None
        env.builders.reset()
        self.guard = IntegrityGuard(allow=self.options.allow, trusted=snapshot, composed=self.composed)
        for stage in self.stages():
            if stage.phase is not None:
                self._phase(stage.phase)
            with self._stage_peak(stage):
                found = self._attributed(stage)
            self.evidence.findings += found.findings
            self.evidence.failure = found.failure
            self.evidence.timings = found.timings or self.evidence.timings
            self.retire = self.retire if found.retire is None else found.retire
            self.evidence.compile = self._compile_result()
            if found.failure is not None or (stage.gate and judge(self.evidence).settled):
                break
        return self._result(judge(self.evidence))

    @contextmanager
    def _stage_peak(self, stage: Stage) -> Iterator[None]:
        """Notes the allocator's peak during `stage` (`MemoryReport.stage_peak_bytes`); the request's
        own peak is kept across the reset (`footprint.PeakMeter`'s carried peaks)."""
        if not self.env.cuda:
            yield
            return
        self.peaks.append(torch.cuda.max_memory_reserved())
        torch.cuda.reset_peak_memory_stats()
        first = len(self.peaks)
        try:
            yield
        finally:
            try:
                peak = max([*self.peaks[first:], torch.cuda.max_memory_reserved()])
                self.stage_peaks[stage.name] = max(peak, self.stage_peaks.get(stage.name, 0))
            except Exception:  # noqa: BLE001 - a context the candidate broke: the verdict says why
                pass

    def _attributed(self, stage: Stage) -> Found:
        """Runs one stage; an exception it lets out is the candidate's, the problem's or the
        machine's as `fault.Blame.halt` decides (once the candidate's code ran), else a defect of
        ours, raised on (the worker reports an internal harness error)."""
        try:
            return stage.run()
        except ProblemBroken:
            raise
        except Halted as halted:
            return Found(failure=halted.failure, retire=halted.retire)
        except BaseException as exc:  # sorted by whose fault it is, or raised on
            doing = PHASE_WORDS.get(self.phase, self.phase)
            decided = self.blame.halt(exc, doing)
            if decided is None:
                raise
            if isinstance(decided, ProblemBroken):
                raise decided from exc
            return Found(failure=decided.failure, retire=decided.retire)

    # -- the stages ----------------------------------------------------------------------------

    def _static(self) -> Found:
        """The static checks of the candidate's source."""
        assert self.guard is not None
        return Found(self.guard.check_source(self.source))

    def _reference(self) -> Found:
        """The problem imported, its Model built (weights from a secret seed) and one input set made,
        before any candidate code runs; then the reference sealed. Raises ProblemBroken."""
        try:
            pmod = self._load(self.problem.source, "kbmcp_problem")
        except Exception as exc:
            raise ProblemBroken("import", exc, (str(self.env.workdir / f"{self.modules[-1]}.py"),)) from exc
        files = (str(getattr(pmod, "__file__", "")),)
        self._plan(pmod)
        seed = secret_seed()
        try:
            init = [x.cuda() if isinstance(x, torch.Tensor) else x for x in pmod.get_init_inputs()]
            torch.manual_seed(seed)
            ref = pmod.Model(*init).cuda().eval()
        except Exception as exc:
            if _oom(exc):
                raise ProblemBroken("too_large", None, too_large=too_large_now(self.footprint)) from exc
            raise ProblemBroken("construct", exc, files) from exc
        try:
            torch.manual_seed(secret_seed())
            with torch.device("cuda"):
                self.input_bytes = tensor_bytes(pmod.get_inputs())
        except Exception as exc:
            if _oom(exc):
                raise ProblemBroken("too_large", None, too_large=too_large_now(self.footprint)) from exc
            raise ProblemBroken("inputs", exc, files) from exc
        self.pmod, self.ref, self.init, self.seed = pmod, ref, init, seed
        self.blame.problem_files = files
        self.blame.reference_bytes = tensor_bytes([*ref.parameters(), *ref.buffers()])
        self.seal = ReferenceSeal.of_problem(pmod)  # before the candidate's code runs
        self.seal.seal_instance(ref)
        if self.composed:
            self._reference_ops(pmod, ref, files)
        return Found()

    def _reference_ops(self, pmod: Any, ref: Any, files: tuple[str, ...]) -> None:
        """Composed mode: the reference's own ops allowed by the guard (`ops.reference_dispatch_ops`)."""
        try:
            self.new_reference_ops = reference_dispatch_ops(self.env, self.problem.hash, self.options.track.value,
                                                            pmod, ref, self.guard)
        except Exception as exc:
            if _oom(exc):
                raise ProblemBroken("too_large", None, too_large=too_large_now(self.footprint)) from exc
            raise ProblemBroken("forward", exc, files) from exc

    def _plan(self, pmod: Any) -> None:
        """The problem's footprint (meta device) and the plan of this verification within the device's
        free memory (`harness.gpu.memory.plan`); a problem that does not fit is refused as its own limit.
        Raises ProblemBroken."""
        self.footprint = measure(pmod)
        free, total = device_free()
        planned = plan(self.footprint, free, total, self.options.checks_on)
        if isinstance(planned, TooLarge):
            raise ProblemBroken("too_large", None, too_large=planned)
        self.plan = planned

    def _candidate(self) -> Found:
        """The candidate imported (its builds recorded); it must define ModelNew."""
        assert self.guard is not None
        self.blame.started(self.env.cuda)
        self.blame.calling("importing the candidate")
        try:
            with self.guard.watch_setup():
                self.cmod = self._load(self.source, "kbmcp_candidate")
        except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything
            self.blame.candidate_files = (str(self.env.workdir / f"{self.modules[-1]}.py"),)
            halted = self._failure(exc, "importing the candidate")
            return Found(failure=halted.failure, retire=halted.retire)
        self.blame.candidate_files = (str(getattr(self.cmod, "__file__", "")),)
        if not isinstance(getattr(self.cmod, "ModelNew", None), type):
            return Found(failure=Failure(kind=FailureKind.no_model, detail="the candidate defines no class ModelNew"))
        return Found()

    def _construct(self) -> Found:
        """ModelNew built with the reference's weight seed, then attached to the integrity guard."""
        assert self.guard is not None
        self.blame.calling("constructing ModelNew")
        try:
            with self.guard.watch_setup():
                torch.manual_seed(self.seed)
                self.cand = with_model_weights(self.cmod.ModelNew(*self.init).cuda().eval(), self.ref, self.composed)
        except BaseException as exc:  # noqa: BLE001
            halted = self._failure(exc, "constructing ModelNew")
            return Found(failure=halted.failure, retire=halted.retire)
        torch.manual_seed(secret_seed())
        return Found(self.guard.attach(self.cmod, self.cand, reference=self.pmod.Model))

    def _check(self) -> Found:
        """The input sets and the checks (`harness.worker.checks`)."""
        assert self.guard is not None
        self.checker = Checker(self, self.pmod, self.ref, self.cand, self.guard)
        with torch.no_grad():
            self.checker.run_sets()
        found = self.guard.findings()
        return Found(found, retire=IntegrityGuard.retire_worker(self.findings + found))

    def _census(self) -> Found:
        """Which kernels one forward launches, from the census worker (see `harness.census`), and
        what the SASS of the candidate's builds computes in (`harness.judgment.precision`), judged against
        the track and the problem's own dtypes."""
        from kb_mcp.harness.worker.integrity_runtime import KernelCensus

        assert self.guard is not None and self.env.builders is not None and self.checker is not None
        self.checker.release()  # the census worker runs a forward of its own on the same device
        reply = self.census = self.ask_census(units=list(self.env.builders.sources))
        if reply.census is not None:  # composed: sorted with the reference's kernel-launching ops
            self.coverage = coverage(self.guard.take_census(KernelCensus.model_validate(reply.census),
                                                            reply.reference_ops))
        if reply.failure is not None:  # how the census ended, judged here like any other failure
            hoarded = self.blame.beside(reply.failure, "the kernel census (in the census worker)")
            if hoarded is not None:  # it ran out where the candidate holds more than its share here
                return Found(reply.findings, failure=hoarded.failure, retire=hoarded.retire)
            return Found(reply.findings, failure=reply.failure)
        self.evidence.precision = precision_check(reply.precision, self.options.track, sorted(self.checker.dtypes))
        return Found(reply.findings + self.guard.findings())

    def _probes(self) -> Found:
        """Kernels on the tensor cores below the track's precision (the census's SASS) are judged by
        their numbers: the precision probes (`harness.worker.probes`), one at a time."""
        check, checker, guard = self.evidence.precision, self.checker, self.guard
        if check is None:
            return Found()
        assert checker is not None and guard is not None
        try:
            check = run_probes(check, self.ref, lambda: checker.make_inputs(secret_seed()), checker.cand_run,
                               numerics=lambda: strict_numerics(self.options.track))
        except Halted as halted:
            return Found(failure=halted.failure, retire=halted.retire)
        self.evidence.precision = check
        found = precision_findings(check, sorted(checker.dtypes)) + guard.findings()
        return Found(found, retire=IntegrityGuard.retire_worker(self.findings + found))

    def _leftovers(self) -> Found:
        """Checked before timing: a mode or trace function left behind by the candidate would slow
        every call timed in this process, the baselines' included."""
        left = self.env.new_guards()
        if not left:
            return Found()
        return Found([Finding(
            code=FindingCode.harness_tampering,
            message=(f"after the candidate ran, {', '.join(left)} stayed active in the harness's process; that "
                     "slows every call timed there (the reference's too). Leave dispatch and function modes, "
                     "trace functions and the profiler as they were"),
        )], retire=True)

    def _sealed(self) -> Found:
        """The reference is timed in this process next (beside the candidate, or for the cache)."""
        assert self.seal is not None
        changed = self.seal.changes(self.pmod, self.ref)
        if not changed:
            return Found()
        return Found([Finding(
            code=FindingCode.harness_tampering,
            message=(f"the reference changed after the problem was loaded ({'; '.join(changed[:4])}); it is "
                     "timed in this process, so a slowed reference would fake a speedup. Leave the problem's "
                     "module and its Model alone"),
        )], retire=True)

    def _timing(self) -> Found:
        """The candidate's timed series (every output re-checked), eager beside it where needed."""
        env, checker, guard = self.env, self.checker, self.guard
        assert checker is not None and guard is not None and env.timer is not None
        # The pool's figures, timed before the candidate in a worker no candidate ran in; else the cache's.
        self.base = self.given_baseline or env.baselines.get(
            self.problem.hash, env.device, env.torch_version, need_compile=self.options.compile_baseline,
            track=self.options.track.value)
        with torch.no_grad():
            self.stats, self.eager = checker.time_candidate(self.base)
        found: list[Finding] = []
        if self.stats.errors:
            found.append(Finding(
                code=FindingCode.timed_output_mismatch, source="timing",
                message=(f"{len(self.stats.errors)} of {len(self.stats.gpu_ms)} timed runs returned wrong outputs "
                         f"({self.stats.errors[0]}) although the checked runs were correct; every call must compute "
                         "its result"),
            ))
        unsync = env.timer.unsynchronized(self.stats)
        if unsync:
            found.append(Finding(code=FindingCode.unsynchronized_work, message=unsync, source="timing"))
        found += guard.findings()
        return Found(found, retire=IntegrityGuard.retire_worker(self.findings + found))

    def _baselines(self) -> Found:
        """Eager and torch.compile (the pool's, or eager measured now in the track's numerics), the
        speedups and their plausibility."""
        checker = self.checker
        assert checker is not None and self.stats is not None
        with torch.no_grad():
            timings = checker.timings(self.stats, self.eager, self.base, self.census)
        if self.new_baseline is not None:
            self.new_baseline = self.new_baseline.model_copy(update={"track": self.options.track.value,
                                                                     "numerics": numerics()})
        # A result that looks too good gets more evidence, which accepts or rejects it (`evidence`).
        found = escalate(self, checker, timings)
        found += self.guard.findings() if self.guard is not None else []
        return Found(found, timings=timings,
                     retire=self.retire or IntegrityGuard.retire_worker(self.findings + found))
