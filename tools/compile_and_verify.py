"""MCP tool `compile_and_verify`: build a candidate, prove it computes the reference's function, time it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kb_mcp.harness.gpu.lane_use import LaneUse
from kb_mcp.harness.judgment.caps import Caps
from kb_mcp.harness.judgment.probing import PrecisionCheck
from kb_mcp.harness.judgment.verdict import CompileResult, Finding, InputSetCheck, Timings, VerifyOptions, VerifyResult
from kb_mcp.harness.problem import Problem
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.models import CandidateRecord, Strength, Verdict
from kb_mcp.tools import candidate_store
from kb_mcp.tools.base import Progress, ToolError, ToolMeta, gpu_lane_inside, harness_unavailable, no_progress
from kb_mcp.tools.context import ToolContext
from kb_mcp.tools.disclosure import private, redact, redact_model
from kb_mcp.tools.source import FileAccess, Source, problem_failed, read_problem, read_source

NAME = "compile_and_verify"
DESCRIPTION = """\
Compile a candidate kernel, check that it computes exactly what the problem's reference computes,
and time it against eager PyTorch and torch.compile. The candidate is Python defining
`class ModelNew(nn.Module)` with the same constructor as the problem's `Model`, whose forward runs
your own CUDA: either raw kernels compiled with NVRTC (`k = torch.cuda._compile_kernel(src, name)`,
launched as `k(grid=(..), block=(..), args=[tensors, ints, floats], shared_mem=bytes)`; builds in
~0.1 s) or a `torch.utils.cpp_extension.load_inline` extension (KernelBench style; cached by content,
keep torch headers out of cuda_sources for fast builds). PyTorch compute ops, cuBLAS and cuDNN are
not allowed inside forward unless `options.allow` names them (e.g. ["gemm"]); for a model, `mode`
"composed" lets it keep the PyTorch ops the reference itself runs beside at least one kernel of its
own (a standard verdict with its `coverage`, the share of GPU time in its own kernels).
It runs in an isolated worker: secret-seed input sets plus one of a different distribution, exact
output type/shape/dtype, tolerances by dtype, poisoned memory, a second-run agreement check, and
integrity checks that catch cheats. Returns `record`, the verdict as stored in the KB: its
candidate_id (pass it to record_outcome), verdict (faster / slower / incorrect / invalid /
compile_error / timeout / crashed / needs_gpu), timings, and `strength`. Keep the default options
for a verdict that counts: only a `standard` one (GPU, full timing, default checks) moves KB scores;
quick timing, stricter or other settings are kept under their own key and never credited, and
loosened ones (allow-list, looser tolerance, higher review threshold or limits) are `flagged`. Also
a one-line summary, compiler messages, integrity findings, timings and speedups. Tensor-core
instructions below the track's precision (TF32 or bf16 in the fp32 track) are accepted only when
precision probes against a float64 reference show the track's accuracy, as an error-compensated
scheme (3xTF32) reaches; `precision` holds their numbers. Without a GPU the
candidate is compiled with nvcc and the verdict is needs_gpu. Set detail=true for per-input-set
errors, full compiler logs and the candidate's output. The first call starts a worker (seconds); a
cold load_inline build or a first torch.compile baseline of a problem can take tens of seconds."""

META = ToolMeta(
    title="Compile, verify and time a candidate kernel",
    uses_gpu=True,
    # each call measures again and stores the newest verdict under its verdict key (candidate + options)
    idempotent=False,
)

OUTPUT_CHARS = 1500  # candidate output shown without detail when it crashed or timed out


class Request(BaseModel):
    """The problem, the candidate, and how to check it."""

    model_config = ConfigDict(extra="forbid")

    problem: Source = Field(description="KernelBench problem: its source text, or a path to a .py file on the server's "
                            "machine (over HTTP read only inside the folders the server's operator allows)")
    candidate: Source = Field(description="candidate defining class ModelNew: its source text, or a path to a .py file "
                              "on the server's machine (over HTTP read only inside the operator's folders)")
    options: VerifyOptions = Field(
        default_factory=VerifyOptions,
        description="seeds, tolerance, timing, allow-list, limits; anything but the defaults keeps the verdict out of "
                    "scores",
    )
    detail: bool = Field(False, description="include per-input-set errors, compiler logs and the candidate's output")
    mode: Literal["own", "composed"] = Field(
        "own",
        description="own (default): every compute op in forward is a kernel of the candidate's own; composed (for "
                    "models): it may also keep the PyTorch ops the reference itself runs, as long as one kernel of "
                    "its own runs; the result says how much of its GPU time runs in its own kernels (coverage). "
                    "Both are standard verdicts, kept apart in every table",
    )

    @model_validator(mode="after")
    def _one_mode(self) -> Request:
        # The mode travels with the options to the worker; given here it wins, given there it is read back.
        if "mode" in self.model_fields_set:
            self.options = self.options.model_copy(update={"mode": self.mode})
        else:
            self.mode = self.options.mode
        return self


class CompileSummary(BaseModel):
    """How the build went, briefly."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    style: str
    seconds: float
    cached: bool
    kernels: list[str] = Field(default_factory=list)
    messages: list[str] = private(default_factory=list, description="compiler errors first, then warnings")


class Correctness(BaseModel):
    """The input sets, summarised."""

    model_config = ConfigDict(extra="forbid")

    sets_passed: int
    sets_total: int
    worst_abs_err: float | None = None
    worst_rel_err: float | None = None
    first_failure: str | None = private(None)


class Result(BaseModel):
    """The server's verdict on the candidate: the stored record, and what this run saw.

    Fields marked private (summary, messages, findings' text, output) carry the candidate's own
    output and exception text: only the caller who submitted the candidate sees them.
    """

    model_config = ConfigDict(extra="forbid")

    record: CandidateRecord = Field(
        description="the verdict as stored in the KB under record.key (candidate_id + options digest): "
        "candidate_id, verdict, timings, options, strength, flagged"
    )
    standing: CandidateRecord | None = Field(
        None,
        description="the candidate's strongest stored verdict when it is not this run's (checked with stronger "
        "options): it is the one record_outcome reads",
    )
    summary: str = private("")
    compile: CompileSummary
    correctness: Correctness
    findings: list[Finding] = private(default_factory=list)
    timings: Timings | None = None
    precision: PrecisionCheck | None = Field(
        None, description="kernels on tensor cores below the track's precision (their SASS), and the precision "
        "probes' numbers that judged them: status, per probe the error ratio against the track's reference")
    tolerance: dict[str, float] = Field(default_factory=dict)
    elapsed_s: float = Field(0.0, description="how long the verification took (seconds)")
    phases_s: dict[str, float] = Field(
        default_factory=dict, description="where elapsed_s went, phase by phase: build_first (the candidate's "
        "load_inline builds, before the GPU lane), lane (waiting for it), queued (a ready worker), reference_baselines "
        "(looked up, or timed first on a problem's first verdict), static, import (loading; builds not made first), "
        "check (the input sets), census, probes, timing, baselines (the comparison), evidence")
    lane: LaneUse | None = Field(
        None, description="the GPU lane: seconds waited in line for it and held (the phases from queued on ran "
        "under it), the place in line on arrival")
    candidate_path: str = Field(description="where the server keeps this candidate's source")
    output: str = private("", description="the candidate's stdout/stderr (detail, or when it crashed / timed out)")
    input_sets: list[InputSetCheck] | None = private(None, description="per input set (detail only)")
    compile_detail: CompileResult | None = private(None, description="build units with full logs (detail only)")
    next_step: str = ""


_NEXT = {
    Verdict.faster: "record_outcome with this candidate_id; profile_kernel it to find the next bottleneck",
    Verdict.slower: "record_outcome with this candidate_id (a slower result teaches the KB too), then try another "
                    "optimization",
    Verdict.incorrect: "fix the kernel (detail=true shows per-set errors), verify again; record_outcome to count the "
                       "failure",
    Verdict.invalid: "the findings say what is not allowed and what to change; verify again after fixing",
    Verdict.compile_error: "fix the compiler errors in `compile.messages` and verify again",
    Verdict.timeout: "the candidate hung or was too slow: check loops, grid sizes and synchronisation",
    Verdict.crashed: "see the summary and output: an exception, illegal memory access or abort in the candidate",
    Verdict.needs_gpu: "it compiles; run on a machine with a GPU to verify and time it",
}


@gpu_lane_inside
def run(ctx: ToolContext, req: Request, progress: Progress = no_progress) -> Result:
    """Verifies the candidate in the worker pool, stores the source and the verdict under its
    verdict key, returns the summary. The GPU lane is held by the pool around the GPU work only:
    reading, static checks and the candidate's build come before it, the KB write after it."""
    problem, candidate = prepare(req, ctx.files)
    return verify_read(ctx, req, problem, candidate, progress)


def verify_read(ctx: ToolContext, req: Request, problem: Problem, candidate: str,
                progress: Progress = no_progress) -> Result:
    """`run` for a problem and candidate text already read and checked (`prepare`, or a candidate the
    server wrote itself): verifies in the worker pool and stores the verdict."""
    try:
        result = ctx.workers.verify(problem, candidate, req.options, progress)
    except RuntimeError as exc:  # WorkerError, SandboxUnavailable: no worker could start at all
        raise harness_unavailable(exc) from exc
    return record(ctx, req, problem, candidate, result)


def prepare(req: Request, files: FileAccess | None) -> tuple[Problem, str]:
    """The request's problem and candidate text, read (a path only as `files` allows: the context's
    `files`) and checked before anything runs (a refused option, a file that is not a problem: the
    caller's to fix, raised as ToolError)."""
    check_options(req)
    return read_problem(req.problem, files), read_source(req.candidate, "candidate", files).text


def check_options(req: Request) -> None:
    """Raises ToolError where the request's options exceed what this server verifies under (and
    SettingError, before anything runs, where the operator's bound on kept sources is unusable)."""
    candidate_store.candidates_kept_per_client()
    refusal = server_caps().refusal(req.options)
    if refusal:
        raise ToolError(refusal)


def server_caps() -> Caps:
    """The caps this server verifies under. They are the operator's settings, so one it cannot use is
    the environment's to fix (`SettingError`, raised by `Caps.from_env`): no argument of the call can."""
    return Caps.from_env()


def record(ctx: ToolContext, req: Request, problem: Problem, candidate: str, result: VerifyResult) -> Result:
    """Stores a verification's verdict (this process's pool's, or one a worker of a cluster sent back
    for the same request) with the candidate's source, and returns the summary: the one place a
    verification becomes a stored verdict. Raises ToolError where the result holds no verdict on
    the candidate (the problem's fault or limit, the machine's)."""
    # Nothing the worker said leaves this process, or reaches the KB or the artifacts, unredacted.
    result = redact_model(result)
    if result.too_large is not None:  # the problem's limit on this GPU: no verdict on the candidate to store
        raise ToolError(f"the problem {problem.path or '(given as source text)'} cannot be verified on this GPU: "
                        f"{result.too_large.text}. Nothing was recorded against the candidate; run it on a GPU with "
                        "more free memory, or with smaller sizes")
    if result.problem_error:  # the problem's fault: no verdict on the candidate exists to store
        raise problem_failed(problem, result.problem_error, "the candidate was not judged and nothing was recorded.")
    if result.not_judged:  # the machine's or the harness's limit, not the candidate's: nothing to store either
        raise ToolError(f"{result.not_judged} (problem {problem.path or '(given as source text)'}; verify again "
                        "once the cause is gone)")
    # who verified it: only that client may record outcomes of the candidate (`KBView.speaks_for`)
    stored = result.record(req.options).model_copy(update={"verified_by": [ctx.client_name]})
    path = candidate_store.save_candidate(ctx.candidates_dir, result, stored, candidate)
    committed = store_verdict(ctx, stored)
    keep_bound(ctx, path, candidate)
    strongest = ctx.store.get_candidate(stored.candidate_id) if committed else None
    standing = strongest if strongest is not None and strongest.key != stored.key else None
    out = summarize(result, stored, standing, str(path), req.detail)
    if not committed:
        out.next_step = f"{VERDICT_PENDING} {out.next_step}"
    return out


VERDICT_LOCK_WAIT_S = 10.0  # then the verdict waits on disk for the lock instead of the agent
VERDICT_PENDING = ("The KB is busy (another process holds its lock), so this verdict is saved on disk and committed "
                   "when the lock frees; record_outcome can use it already.")


def store_verdict(ctx: ToolContext, record: CandidateRecord) -> bool:
    """Stores the verdict in the KB under its verdict key: persisted first, so a busy or hung lock
    holder cannot lose it. False when it still waits for the lock (committed by the next
    transaction of any process)."""
    return ctx.store.commit_soon(candidate_store.pending_key(record), lambda tx: tx.put_candidate(record),
                                 wait_s=VERDICT_LOCK_WAIT_S)


def keep_bound(ctx: ToolContext, path: Path, source: str) -> None:
    """The client's oldest candidate sources beyond its bound go (`candidate_store.trim`). This one's
    source is written again if it went meanwhile: the same source verified by another client, judged
    that client's alone just before this verdict was committed."""
    candidate_store.trim(ctx.store, path.parent, ctx.client_name, candidate_store.candidates_kept_per_client())
    if not path.exists():
        write_atomic(path, source)


def summarize(result: VerifyResult, record: CandidateRecord, standing: CandidateRecord | None, path: str,
              detail: bool) -> Result:
    """The compact tool result (details only when asked)."""
    sets = result.input_sets
    failed = [s for s in sets if not s.passed]
    abs_errs = [s.max_abs_err for s in sets if s.max_abs_err is not None]
    rel_errs = [s.max_rel_err for s in sets if s.max_rel_err is not None]
    comp = result.compile
    show_output = detail or result.verdict in (Verdict.crashed, Verdict.timeout)
    output = result.output if detail else result.output[-OUTPUT_CHARS:]
    summary = result.summary
    if record.loosened and "loosened" not in summary:
        summary += f" [flagged: options loosened by the caller: {'; '.join(record.loosened)}]"
    next_step = _NEXT[result.verdict]
    if standing is not None:
        next_step = (f"a stronger verdict ({standing.verdict.value}, {standing.strength.value}) is stored for this "
                     f"candidate and stands; this run ({record.strength.value}) is kept beside it. " + next_step)
    elif record.strength in (Strength.loosened, Strength.custom, Strength.quick):
        next_step = (f"checked with non-default options ({record.strength.value}: "
                     f"{', '.join(f'{k}={v}' for k, v in record.options.items())}): kept under its own key and never "
                     "credited by record_outcome; verify with the default options for a verdict that counts. "
                     + next_step)
    return Result(
        record=record,
        standing=standing,
        summary=redact(summary),
        compile=CompileSummary(ok=comp.ok, style=comp.style, seconds=comp.seconds, cached=comp.cached,
                               kernels=comp.kernels, messages=comp.messages),
        correctness=Correctness(
            sets_passed=len(sets) - len(failed), sets_total=len(sets),
            worst_abs_err=max(abs_errs) if abs_errs else None, worst_rel_err=max(rel_errs) if rel_errs else None,
            first_failure=f"set {failed[0].index} ({failed[0].kind}): {failed[0].message}" if failed else None,
        ),
        findings=result.findings,
        timings=result.timings,
        precision=result.precision,
        tolerance=result.tolerance,
        elapsed_s=result.elapsed_s,
        phases_s=result.phases_s,
        lane=result.lane,
        candidate_path=path,
        output=output if show_output else "",
        input_sets=sets if detail else None,
        compile_detail=comp if detail else None,
        next_step=next_step,
    )
