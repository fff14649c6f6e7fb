"""MCP tool `compile_and_verify`: build a candidate, prove it computes the reference's function, time it."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness.verdict import CompileResult, Finding, InputSetCheck, Timings, VerifyOptions, VerifyResult
from kb_mcp.kb.models import Verdict
from kb_mcp.tools.base import Progress, ToolError, ToolMeta, no_progress, on_gpu_lane
from kb_mcp.tools.context import ToolContext
from kb_mcp.tools.source import Source, read_problem, read_source

NAME = "compile_and_verify"
DESCRIPTION = """\
Compile a candidate kernel, check that it computes exactly what the problem's reference computes,
and time it against eager PyTorch and torch.compile. The candidate is Python defining
`class ModelNew(nn.Module)` with the same constructor as the problem's `Model`, whose forward runs
your own CUDA: either raw kernels compiled with NVRTC (`k = torch.cuda._compile_kernel(src, name)`,
launched as `k(grid=(..), block=(..), args=[tensors, ints, floats], shared_mem=bytes)`; builds in
~0.1 s) or a `torch.utils.cpp_extension.load_inline` extension (KernelBench style; cached by content,
keep torch headers out of cuda_sources for fast builds). PyTorch compute ops, cuBLAS and cuDNN are
not allowed inside forward unless `options.allow` names them (e.g. ["gemm"]).
It runs in an isolated worker: secret-seed input sets plus one of a different distribution, exact
output type/shape/dtype, tolerances by dtype, poisoned memory, a second-run agreement check, and
integrity checks that catch cheats. Returns candidate_id (pass it to record_outcome), the verdict
(faster / slower / incorrect / invalid / compile_error / timeout / crashed / needs_gpu), a one-line
summary, compiler messages, integrity findings, timings and speedups. `flagged` means held for review
(implausible speedup or loosened tolerance): it will not move KB scores. Without a GPU the candidate
is compiled with nvcc and the verdict is needs_gpu. Set detail=true for per-input-set errors, full
compiler logs and the candidate's output. The first call starts a worker (seconds); a cold
load_inline build or a first torch.compile baseline of a problem can take tens of seconds."""

META = ToolMeta(
    title="Compile, verify and time a candidate kernel",
    uses_gpu=True,
    # each call measures again and stores the newest verdict under the candidate_id
    idempotent=False,
)

OUTPUT_CHARS = 1500  # candidate output shown without detail when it crashed or timed out


class Request(BaseModel):
    """The problem, the candidate, and how to check it."""

    model_config = ConfigDict(extra="forbid")

    problem: Source = Field(description="KernelBench problem: a path to a .py file, or its source text")
    candidate: Source = Field(description="candidate defining class ModelNew: a path to a .py file, or its source text")
    options: VerifyOptions = Field(default_factory=VerifyOptions, description="seeds, tolerance, timing, allow-list, limits")
    detail: bool = Field(False, description="include per-input-set errors, compiler logs and the candidate's output")


class CompileSummary(BaseModel):
    """How the build went, briefly."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    style: str
    seconds: float
    cached: bool
    kernels: list[str] = Field(default_factory=list)
    messages: list[str] = Field(default_factory=list, description="compiler errors first, then warnings")


class Correctness(BaseModel):
    """The input sets, summarised."""

    model_config = ConfigDict(extra="forbid")

    sets_passed: int
    sets_total: int
    worst_abs_err: float | None = None
    worst_rel_err: float | None = None
    first_failure: str | None = None


class Result(BaseModel):
    """The server's verdict on the candidate (also stored in the KB under candidate_id)."""

    model_config = ConfigDict(extra="forbid")

    candidate_id: str
    verdict: Verdict
    summary: str
    flagged: bool = False
    compile: CompileSummary
    correctness: Correctness
    findings: list[Finding] = Field(default_factory=list)
    timings: Timings | None = None
    tolerance: dict[str, float] = Field(default_factory=dict)
    device: str = ""
    arch: str = ""
    candidate_path: str = Field(description="where the server keeps this candidate's source")
    output: str = Field("", description="the candidate's stdout/stderr (detail, or when it crashed / timed out)")
    input_sets: list[InputSetCheck] | None = Field(None, description="per input set (detail only)")
    compile_detail: CompileResult | None = Field(None, description="build units with full logs (detail only)")
    next_step: str = ""


_NEXT = {
    Verdict.faster: "record_outcome with this candidate_id; profile_kernel it to find the next bottleneck",
    Verdict.slower: "record_outcome with this candidate_id (a slower result teaches the KB too), then try another optimization",
    Verdict.incorrect: "fix the kernel (detail=true shows per-set errors), verify again; record_outcome to count the failure",
    Verdict.invalid: "the findings say what is not allowed and what to change; verify again after fixing",
    Verdict.compile_error: "fix the compiler errors in `compile.messages` and verify again",
    Verdict.timeout: "the candidate hung or was too slow: check loops, grid sizes and synchronisation",
    Verdict.crashed: "see the summary and output: an exception, illegal memory access or abort in the candidate",
    Verdict.needs_gpu: "it compiles; run on a machine with a GPU to verify and time it",
}


@on_gpu_lane(NAME)
def run(ctx: ToolContext, req: Request, progress: Progress = no_progress) -> Result:
    """Verifies the candidate in the worker pool, stores the source and the verdict, returns the summary."""
    problem = read_problem(req.problem)
    candidate = read_source(req.candidate, "candidate").text
    ctx.settle_profiler()
    try:
        result = ctx.workers.verify(problem, candidate, req.options, progress)
    except RuntimeError as exc:  # WorkerError: no worker could start at all
        raise ToolError(f"the harness worker is unavailable: {exc}") from exc
    if result.problem_error:  # the problem's fault: no verdict on the candidate exists to store
        raise ToolError(
            f"the problem {problem.path or '(given as source text)'} failed before the candidate ran: "
            f"{result.problem_error}. Fix the problem; the candidate was not judged and nothing was recorded."
        )
    path = save_candidate(ctx, result, candidate)
    out = summarize(result, str(path), req.detail)
    if not store_verdict(ctx, result):
        out.next_step = f"{VERDICT_PENDING} {out.next_step}"
    return out


VERDICT_LOCK_WAIT_S = 10.0  # then the verdict waits on disk for the lock instead of the agent
VERDICT_PENDING = ("The KB is busy (another process holds its lock), so this verdict is saved on disk and committed "
                   "when the lock frees; record_outcome can use it already.")


def store_verdict(ctx: ToolContext, result: VerifyResult) -> bool:
    """Stores the verdict in the KB: persisted first, so a busy or hung lock holder cannot lose it.
    False when it still waits for the lock (committed by the next transaction of any process)."""
    record = result.record()
    return ctx.store.commit_soon(f"candidate-{record.candidate_id}", lambda tx: tx.put_candidate(record),
                                 wait_s=VERDICT_LOCK_WAIT_S)


def save_candidate(ctx: ToolContext, result: VerifyResult, source: str) -> Path:
    """Keeps the candidate source and the full result beside the KB, named by candidate_id."""
    folder = ctx.candidates_dir
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{result.candidate_id}.py"
    if not path.exists():
        path.write_text(source)
    report = folder / f"{result.candidate_id}.json"
    tmp = report.with_name(f".{report.name}.tmp-{os.getpid()}")
    tmp.write_text(result.model_dump_json(indent=1))
    os.replace(tmp, report)  # a reader (or kb gc) never sees half a verdict
    return path


def summarize(result: VerifyResult, path: str, detail: bool) -> Result:
    """The compact tool result (details only when asked)."""
    sets = result.input_sets
    failed = [s for s in sets if not s.passed]
    abs_errs = [s.max_abs_err for s in sets if s.max_abs_err is not None]
    rel_errs = [s.max_rel_err for s in sets if s.max_rel_err is not None]
    comp = result.compile
    show_output = detail or result.verdict in (Verdict.crashed, Verdict.timeout)
    output = result.output if detail else result.output[-OUTPUT_CHARS:]
    return Result(
        candidate_id=result.candidate_id,
        verdict=result.verdict,
        summary=result.summary,
        flagged=result.flagged,
        compile=CompileSummary(ok=comp.ok, style=comp.style, seconds=comp.seconds, cached=comp.cached,
                               kernels=comp.kernels, messages=comp.messages),
        correctness=Correctness(
            sets_passed=len(sets) - len(failed), sets_total=len(sets),
            worst_abs_err=max(abs_errs) if abs_errs else None, worst_rel_err=max(rel_errs) if rel_errs else None,
            first_failure=f"set {failed[0].index} ({failed[0].kind}): {failed[0].message}" if failed else None,
        ),
        findings=result.findings,
        timings=result.timings,
        tolerance=result.tolerance,
        device=result.device,
        arch=result.arch,
        candidate_path=path,
        output=output if show_output else "",
        input_sets=sets if detail else None,
        compile_detail=comp if detail else None,
        next_step=_NEXT[result.verdict],
    )
