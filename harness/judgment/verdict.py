"""What the harness concludes about a candidate: the verify result, and the one function that judges the
evidence. The findings, the build's result, the input sets' checks and the timings it reads are in
`harness.judgment.findings` (importable from here too).
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness.gpu.lane_use import LaneUse
from kb_mcp.harness.gpu.memory import MemoryReport, TooLarge
from kb_mcp.harness.judgment.findings import (
    EXPLAINED_BY_PRECISION,
    INCORRECT_ONLY,
    REVIEW_ONLY,
    CompileResult,
    CompileUnit,
    Finding,
    FindingCode,
    InputSetCheck,
    Timings,
)
from kb_mcp.harness.judgment.options import VerifyOptions, assess_options
from kb_mcp.harness.judgment.probing import PrecisionCheck
from kb_mcp.kb.models import DEFAULT_MODE, DEFAULT_TRACK, CandidateRecord, Mode, Track, Verdict

# What a verification records (`harness.judgment.findings`) stays importable from here, where callers find it.
__all__ = [
    "EXPLAINED_BY_PRECISION", "INCORRECT_ONLY", "NOT_JUDGED", "REVIEW_ONLY", "CompileResult", "CompileUnit",
    "Evidence", "Failure", "FailureKind", "Finding", "FindingCode", "GpuMemory", "InputSetCheck", "Judgement",
    "Timings", "VerifyOptions", "VerifyResult", "decide", "gib", "judge",
]


class VerifyResult(BaseModel):
    """The harness's answer on one candidate for one problem. Summary first; details below it."""

    model_config = ConfigDict(extra="forbid")

    candidate_id: str
    problem: str
    problem_hash: str
    verdict: Verdict
    summary: str  # one line an agent can act on
    flagged: bool = False  # held for review (implausible speedup, loosened tolerance): never moves a score
    compile: CompileResult
    input_sets: list[InputSetCheck] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    timings: Timings | None = None
    tolerance: dict[str, float] = Field(default_factory=dict)  # atol/rtol used
    device: str = ""
    arch: str = ""
    torch_version: str = ""
    output: str = ""  # the candidate's captured stdout/stderr, truncated
    phase: str = ""  # where it ended (for timeout/crashed: where it was)
    loosened: str = ""  # set when the caller's tolerance is looser than the problem's: what was loosened
    # The problem itself failed (its module or its Model raised before any candidate code ran):
    # the verdict then says nothing about the candidate, and the server stores none.
    problem_error: str = ""
    too_large: TooLarge | None = None  # the problem does not fit this GPU (then `problem_error` says so too)
    # The machine or the harness, not the candidate, ended the run (`verdict.NOT_JUDGED`: the GPU
    # ran out of memory through no fault of the candidate's, ...): the summary says why, the verdict
    # says nothing about the candidate, and the server stores none.
    not_judged: str = ""
    elapsed_s: float = 0.0
    # Where `elapsed_s` went, phase by phase (`harness.phases.PhaseClock`; the names of `phases.PHASES`).
    phases_s: dict[str, float] = Field(default_factory=dict)
    lane: LaneUse | None = None  # how long it waited for the GPU lane and held it (`harness.gpu.lane_use`)
    worker_replaced: bool = False
    track: Track = DEFAULT_TRACK  # the precision track it was verified in (its tolerance, its scores)
    memory: MemoryReport | None = None  # its footprint, the plan and the peak it took (`harness.gpu.memory`)
    # Kernels on tensor cores below the track's precision, and what the precision probes found
    # (`harness.judgment.probing`).
    precision: PrecisionCheck | None = None
    mode: Mode = DEFAULT_MODE  # own kernels only, or composed with the reference's own ops (`VerifyOptions.mode`)
    # The share of the candidate's GPU time in its own kernels (0..1) in one censused forward
    # (`kernels.coverage`); measured on every GPU run that reached the census, None where not.
    coverage: float | None = None
    # Whether what the candidate's sandboxed processes tried was recorded ("recorded", or "not
    # recorded: why"; `harness.sandbox.watch`); the attempts themselves are the `sandbox_attempt` finding.
    attempts: str = ""

    def record(self, options: VerifyOptions) -> CandidateRecord:
        """The KB's record of this verdict (what `record_outcome` reads), keyed by the options it
        was checked with: what they let it claim is decided by `assess_options`."""
        t = self.timings
        assessed = assess_options(options, gpu=bool(self.device), tolerance_loosened=self.loosened)
        return CandidateRecord(
            candidate_id=self.candidate_id,
            problem=self.problem,
            problem_hash=self.problem_hash,
            verdict=self.verdict,
            track=options.track,
            mode=options.mode,
            coverage=self.coverage,
            arch=self.arch if self.device else "",
            device=self.device,
            time_ms=t.candidate_ms if t else None,
            eager_ms=t.eager_ms if t else None,
            compile_ms=t.compile_ms if t else None,
            speedup_vs_baseline=t.speedup_vs_baseline if t else None,
            device_ms=t.candidate_device_ms if t else None,
            eager_device_ms=t.eager_device_ms if t else None,
            flagged=self.flagged or bool(assessed.loosened),
            findings=[f.code.value for f in self.findings],
            attempt=next((f.message for f in self.findings if f.code == FindingCode.sandbox_attempt), ""),
            options=assessed.options,
            strength=assessed.strength,
            loosened=assessed.loosened,
        )


def decide(
    compile: CompileResult,
    input_sets: list[InputSetCheck],
    findings: list[Finding],
    timings: Timings | None,
    *,
    gpu: bool = True,
    loosened: str = "",
    precision: PrecisionCheck | None = None,
) -> tuple[Verdict, bool, str]:
    """The verdict, whether it is held for review, and a one-line summary.

    Order: a build failure is `compile_error`; then any integrity finding that names a cheat is
    `invalid` (a shifted-only failure beside `precision_lowered` is that precision's error, not a
    cheat); then a failed input set (or a wrong-answer finding) is `incorrect`; without a GPU a
    clean build is `needs_gpu`; otherwise the speedup over the better baseline (end-to-end times)
    decides between `faster` and `slower`; the device times are shown beside it, never decide.
    `loosened` (a note that the caller loosened the tolerance) and review-only findings set the
    flag without changing the verdict. `precision` (kernels on tensor cores below the track's
    precision) is named in a valid or needs_gpu summary: the scheme the probes saw, or that they
    will judge it on a GPU; a failed check arrives as its `precision_lowered` finding.
    """
    flagged = bool(loosened) or any(f.code in REVIEW_ONLY for f in findings)
    notes = ([loosened] if loosened else []) + [f.message for f in findings if f.code in REVIEW_ONLY][:1]
    tail = f" [flagged: {'; '.join(notes)}]" if flagged else ""
    if not compile.ok:
        first = compile.messages[0] if compile.messages else "the build failed"
        return Verdict.compile_error, False, f"compile error: {first}"
    lowered = any(f.code == FindingCode.precision_lowered for f in findings)
    cheats = [f for f in findings if f.code not in INCORRECT_ONLY and f.code not in REVIEW_ONLY
              and not (lowered and f.code in EXPLAINED_BY_PRECISION)]
    if cheats:
        codes = sorted({f.code.value for f in cheats})
        return Verdict.invalid, flagged, f"invalid ({', '.join(codes)}): {cheats[0].message}{tail}"
    failed = [s for s in input_sets if not s.passed]
    wrong = [f for f in findings if f.code in INCORRECT_ONLY]
    if failed or wrong:
        if failed:
            s = failed[0]
            what = (
                f"input set {s.index} ({s.kind}): {s.message}"
                if s.message
                else f"input set {s.index} ({s.kind}): {s.mismatched} of {s.numel} elements outside the tolerance"
            )
            what = f"{len(failed)} of {len(input_sets)} input sets failed; first {what}"
        else:
            what = wrong[0].message
        extra = f" ({', '.join(sorted({f.code.value for f in wrong}))})" if wrong else ""
        return Verdict.incorrect, flagged, f"incorrect{extra}: {what}{tail}"
    if not gpu:
        n = len(compile.units)
        limits = [f"{u.name}: {u.limited}" for u in compile.units if u.limited]
        limited = f"; not compiled fully here, this machine's limit: {'; '.join(limits)}" if limits else ""
        pending = f"; {precision.pending_note()}" if precision is not None and precision.status == "pending" else ""
        return (
            Verdict.needs_gpu,
            flagged,
            f"compiled ({n} unit{'s' if n != 1 else ''}, {compile.arch or 'default arch'}); verification and timing "
            f"need a GPU{limited}{pending}",
        )
    return _timed(input_sets, timings, precision, flagged, tail)


def _timed(input_sets: list[InputSetCheck], timings: Timings | None, precision: PrecisionCheck | None,
           flagged: bool, tail: str) -> tuple[Verdict, bool, str]:
    """`decide` for a candidate that passed every check: faster or slower, and what backs it."""
    if timings is None or timings.speedup_vs_baseline is None:
        raise ValueError("a verified candidate needs timings with a baseline speedup to get a verdict")
    speedup = timings.speedup_vs_baseline
    verdict = Verdict.faster if speedup > 1.0 else Verdict.slower
    base = "eager" if timings.compile_ms is None or (timings.eager_ms or 0) <= timings.compile_ms else "torch.compile"
    ran = [c for c in input_sets if not c.skipped]
    skipped = [f"{c.kind}: {c.message}" for c in input_sets if c.skipped and c.message]
    notes_tail = f"; not run: {'; '.join(dict.fromkeys(skipped))}" if skipped else ""
    evidence_tail = f"; evidence: {'; '.join(timings.evidence)}" if timings.evidence else ""
    device = f"; {timings.device_summary}" if timings.device_summary else ""
    if precision is not None and precision.status == "passed":
        evidence_tail += f"; precision: {precision.scheme()}; {precision.evidence()}"
    arbitrated = [c for c in ran if c.float64_ratio is not None]
    if arbitrated:
        worst = max(c.float64_ratio or 0.0 for c in arbitrated)
        evidence_tail += (f"; {len(arbitrated)} of them outside the float32 tolerance by the reference's own rounding "
                          f"(judged against float64: worst {worst:.3g}x its error)")
    return (
        verdict,
        flagged,
        f"{verdict.value}: {timings.candidate_ms:.4g} ms vs {base} "
        f"{min(x for x in (timings.eager_ms, timings.compile_ms) if x is not None):.4g} ms ({speedup:.2f}x){device}; "
        f"{len(ran)} input sets correct{notes_tail}{evidence_tail}{tail}",
    )


# ---------------------------------------------------------------------------------------------
# Evidence: what the stages of a verification found, and the one function that judges it.


class FailureKind(str, Enum):
    """How a run ended before the candidate could be judged on its outputs. Every ending of a
    verification or a census is one of these (worded by `judge`, nowhere else)."""

    # The candidate, in the verify worker's stages:
    malformed = "malformed"  # the source is no candidate (empty, not Python, no ModelNew): `harness.candidate`
    build_failed = "build_failed"  # a build of the candidate failed (the compile result says how)
    syntax_error = "syntax_error"  # the candidate's Python does not parse
    no_model = "no_model"  # the candidate defines no class ModelNew
    out_of_memory = "out_of_memory"
    cuda_error = "cuda_error"
    exited = "exited"  # it tried to end the worker (SystemExit, KeyboardInterrupt)
    raised = "raised"  # any other exception
    problem_output = "problem_output"  # the problem's Model returned something other than tensors
    # The problem's own code failed: the result carries `problem_error`, no verdict on the candidate.
    problem_failed = "problem_failed"
    # Running out of GPU memory (`worker.fault`, with the numbers in `memory`): the candidate's when
    # it holds more than its share, else the machine's (`NOT_JUDGED`: no verdict on the candidate).
    memory_hoarded = "memory_hoarded"  # the harness's allocation failed because the candidate holds too much
    harness_out_of_memory = "harness_out_of_memory"  # the GPU was short, and not through the candidate
    # The problem's Model hit a CUDA error on the harness's own different-distribution inputs: a
    # limit of the harness's check for this problem (`NOT_JUDGED`).
    shifted_inputs_rejected = "shifted_inputs_rejected"
    # The verify worker, as the pool saw it end:
    timed_out = "timed_out"  # no answer within `limit_s` while `where`; killed
    worker_died = "worker_died"  # the process ended (`detail`: how) while `where`
    forged_frame = "forged_frame"  # its channel carried data the harness did not send (a forged_result finding)
    internal_error = "internal_error"  # the harness itself raised (`detail`)
    # The census worker (`harness.worker.census`), as it or the pool saw it end:
    census_raised = "census_raised"  # the candidate raised there (`where`, `detail`)
    census_context_broken = "census_context_broken"  # its CUDA context broke during the census
    census_timed_out = "census_timed_out"
    census_died = "census_died"
    census_problem_failed = "census_problem_failed"  # the problem failed there (a census asked for alone)
    census_problem_diverged = "census_problem_diverged"  # the problem loaded in the verify worker, not there
    census_internal_error = "census_internal_error"


# Endings that say nothing about the candidate and are not its fault (the machine or the harness
# ended the run): the result carries the summary in `VerifyResult.not_judged`, and the server
# stores no verdict (as for `problem_failed`, whose result carries `problem_error`).
NOT_JUDGED = frozenset({FailureKind.harness_out_of_memory, FailureKind.shifted_inputs_rejected})

_CENSUS_WORKER = "the census worker runs one forward under the profiler, in a process of its own"
# The verdict and summary of each kind, formatted with the Failure's fields (`judged` handles the
# kinds whose summary reads more than the Failure).
_WORDING: dict[FailureKind, tuple[Verdict, str]] = {
    FailureKind.malformed: (Verdict.compile_error, "compile error: {detail}"),
    FailureKind.syntax_error: (Verdict.compile_error, "compile error: {detail}"),
    FailureKind.no_model: (Verdict.compile_error, "compile error: {detail}"),
    FailureKind.out_of_memory: (Verdict.crashed, "crashed: {where} ran out of GPU memory: {detail}"),
    FailureKind.exited: (Verdict.crashed, "crashed: {where} tried to exit the worker ({detail})"),
    FailureKind.raised: (Verdict.crashed, "crashed: {where} raised {detail}"),
    FailureKind.problem_output: (Verdict.crashed, "crashed: {detail}"),
    FailureKind.problem_failed: (Verdict.crashed, "the problem failed: {detail}"),
    FailureKind.timed_out: (Verdict.timeout, "timeout: no answer within {limit_s:.0f} s while {where}; the worker "
                                             "was killed and replaced"),
    FailureKind.worker_died: (Verdict.crashed, "crashed: the worker died ({detail}) while {where}; it was replaced"),
    FailureKind.internal_error: (Verdict.crashed, "crashed: internal harness error ({detail}); the worker was "
                                                  "replaced"),
    FailureKind.census_raised: (Verdict.crashed, "crashed: {where} raised {detail} in the census worker (where one "
                                                 "forward runs under the profiler, in a process of its own), "
                                                 "although it passed the checks"),
    FailureKind.census_context_broken: (Verdict.crashed, "crashed: the CUDA context of the census worker broke "
                                                         "during the census"),
    FailureKind.census_timed_out: (Verdict.timeout, "timeout: no answer within {limit_s:.0f} s while {where} ("
                                                    + _CENSUS_WORKER + "); it was killed and replaced"),
    FailureKind.census_died: (Verdict.crashed, "crashed: the census worker died ({detail}) while {where} ("
                                               + _CENSUS_WORKER + "); it was replaced"),
    FailureKind.census_problem_failed: (Verdict.crashed, "crashed: the problem failed: {detail}"),
    FailureKind.census_problem_diverged: (Verdict.crashed, "crashed: the problem failed in the census worker "
                                                           "({detail})"),
    FailureKind.census_internal_error: (Verdict.crashed, "crashed: internal error of the census worker ({detail}); "
                                                         "it was replaced"),
    # Worded from `Failure.memory` (`Failure._memory_words`); these stand where the numbers are missing.
    FailureKind.memory_hoarded: (Verdict.crashed, "crashed: ModelNew holds GPU memory beyond its share after {where}, "
                                                  "so the harness could not allocate what it needed: {detail}"),
    FailureKind.harness_out_of_memory: (Verdict.crashed, "not judged: the GPU ran out of memory while {where} "
                                                         "({detail}): the machine's limit, not the candidate's fault, "
                                                         "and nothing was stored"),
    FailureKind.shifted_inputs_rejected: (Verdict.crashed, "not judged: the problem's Model raised a CUDA error on "
                                                           "the harness's different-distribution inputs ({where}): "
                                                           "{detail}. Where the problem accepts only inputs like "
                                                           "get_inputs' own, define get_shifted_inputs() in it to "
                                                           "choose that set; nothing was stored"),
}


def gib(n: int | None) -> str:
    """Bytes as GiB, for summaries."""
    return "an unknown amount" if n is None else f"{n / 2**30:.2f} GiB"


class GpuMemory(BaseModel):
    """The GPU's memory when an allocation failed (bytes; `worker.fault` measures and decides)."""

    model_config = ConfigDict(extra="forbid")

    asked: int | None = None  # what the failing allocation asked for (None: not said)
    free: int = 0  # free on the device
    total: int = 0
    held: int = 0  # what the candidate holds: the allocator's bytes beyond the level before its import
    share: int = 0  # what it may hold: the reference's parameters, two input sets and outputs, a workspace
    process: int = 0  # what this process's allocator has reserved

    @property
    def others(self) -> int:
        """What other processes (and CUDA contexts) hold."""
        return max(0, self.total - self.free - self.process)


class Failure(BaseModel):
    """A stage's (or the pool's) evidence that the run cannot go on: what failed, where, and what it said."""

    model_config = ConfigDict(extra="forbid")

    kind: FailureKind
    where: str = ""  # e.g. "importing the candidate", "ModelNew.forward", the phase a worker was in
    detail: str = ""  # the error, one line or a short traceback; how a worker exited
    context_healthy: bool = True  # the CUDA context still computes correctly afterwards
    limit_s: float = 0.0  # timed_out, census_timed_out: the limit the phase ran under
    memory: GpuMemory | None = None  # out_of_memory, memory_hoarded, harness_out_of_memory: the numbers

    def judged(self, evidence: Evidence) -> tuple[Verdict, str]:
        """Its verdict and summary (see `judge`); a build failure and a forged frame read the rest
        of the evidence (the compiler's first message, the forged_result finding)."""
        k = self.kind
        if k == FailureKind.build_failed:
            messages = evidence.compile.messages
            return Verdict.compile_error, f"compile error: {messages[0] if messages else 'build failed'}"
        if k == FailureKind.cuda_error:
            state = ("the CUDA context survived" if self.context_healthy
                     else "the CUDA context is corrupted; worker replaced")
            return Verdict.crashed, f"crashed: {self.where} raised a CUDA error ({state}): {self.detail}"
        if k == FailureKind.forged_frame:
            forged = [f.message for f in evidence.findings if f.code == FindingCode.forged_result]
            return Verdict.invalid, f"invalid (forged_result): {forged[0] if forged else self.detail}"
        if k == FailureKind.census_context_broken and self.detail:
            after = self.where or "the candidate ran"
            return Verdict.crashed, f"crashed: the CUDA context of the census worker broke after {after}: {self.detail}"
        if self.memory is not None:
            return Verdict.crashed, self._memory_words(self.memory)
        verdict, wording = _WORDING[k]
        return verdict, wording.format(where=self.where, detail=self.detail, limit_s=self.limit_s)

    def _memory_words(self, m: GpuMemory) -> str:
        """The summary of running out of GPU memory, with the numbers (whose fault: `worker.fault`)."""
        device = f"{gib(m.free)} of {gib(m.total)} free"
        if self.kind == FailureKind.harness_out_of_memory:
            return (f"not judged: the GPU ran out of memory while {self.where} ({gib(m.asked)} asked, {device}; this "
                    f"process holds {gib(m.process)}, ModelNew {gib(m.held)} of it, within its share of "
                    f"{gib(m.share)}; other processes {gib(m.others)}): the machine's limit, not the candidate's "
                    "fault, and nothing was stored. Free GPU memory, or verify on a GPU with more")
        if self.kind == FailureKind.memory_hoarded:
            return (f"crashed: ModelNew holds {gib(m.held)} of GPU memory after {self.where}, beyond its share of "
                    f"{gib(m.share)} (the reference's parameters, two input sets with their outputs, a workspace), so "
                    f"the harness could not allocate {gib(m.asked)} ({device}); free what ModelNew keeps between "
                    "calls")
        return (f"crashed: {self.where} ran out of GPU memory: {self.detail} (ModelNew holds {gib(m.held)}, its share "
                f"{gib(m.share)}; {device})")


class Evidence(BaseModel):
    """Everything the stages of one verification returned, in the order they ran."""

    model_config = ConfigDict(extra="forbid")

    compile: CompileResult = Field(default_factory=lambda: CompileResult(ok=True))
    input_sets: list[InputSetCheck] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    timings: Timings | None = None  # set by the last stage of a GPU run: then the speedup decides
    failure: Failure | None = None  # a stage ended the run
    loosened: str = ""  # the caller's tolerance is looser than the problem's (a note)
    precision: PrecisionCheck | None = None  # kernels below the track's precision, and the probes' numbers


class Judgement(BaseModel):
    """The verdict on the evidence, whether it is held for review, and its one-line summary."""

    model_config = ConfigDict(extra="forbid")

    verdict: Verdict
    flagged: bool
    summary: str
    not_judged: bool = False  # the machine or the harness ended the run (`NOT_JUDGED`): nothing is stored

    @property
    def settled(self) -> bool:
        """True when nothing a later stage finds can change the verdict: anything but needs_gpu
        before the timings (a failure, a cheat, a wrong answer)."""
        return self.verdict != Verdict.needs_gpu


def judge(evidence: Evidence) -> Judgement:
    """The one place evidence becomes a verdict and its summary: the GPU worker's stages, the
    compile-only path, and every other ending (the pool's timeouts, dead workers and forged frames,
    a failed problem, the census worker's endings, the harness's own errors), which arrive as a
    `Failure` with no other evidence. A failure decides it (`Failure.judged`); else `decide` on
    the findings, the input sets and, on a GPU run that reached them, the timings."""
    if evidence.failure is not None:
        verdict, summary = evidence.failure.judged(evidence)
        return Judgement(verdict=verdict, flagged=False, summary=summary,
                         not_judged=evidence.failure.kind in NOT_JUDGED)
    verdict, flagged, summary = decide(evidence.compile, evidence.input_sets, evidence.findings, evidence.timings,
                                       gpu=evidence.timings is not None, loosened=evidence.loosened,
                                       precision=evidence.precision)
    return Judgement(verdict=verdict, flagged=flagged, summary=summary)
