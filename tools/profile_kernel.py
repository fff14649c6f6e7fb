"""MCP tool `profile_kernel`: one forward of a problem (or a candidate) under Nsight Compute."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kb_mcp.harness.candidate import CandidateError, parse_candidate
from kb_mcp.harness.gpu.gpu_probe import no_gpu_reason
from kb_mcp.harness.judgment.verdict import Finding, FindingCode
from kb_mcp.harness.problem import Problem, candidate_id
from kb_mcp.harness.profile_model import KernelMetrics, KernelProfile, Profile
from kb_mcp.profiling.ncu_import import ReportImportError, import_report
from kb_mcp.profiling.profile_standby import Standby
from kb_mcp.profiling.profile_store import ProfileStore, new_profile_id
from kb_mcp.profiling.profiler import (
    NoGpuError,
    ProblemFailedError,
    ProfileOptions,
    ProfilerError,
    profile,
    start_standby,
)
from kb_mcp.tools.base import Progress, ToolError, ToolMeta, harness_unavailable, no_progress, on_gpu_lane
from kb_mcp.tools.context import ToolContext
from kb_mcp.tools.disclosure import redact_model, secret_in
from kb_mcp.tools.source import Source, problem_failed, read_problem, read_source, readable_file

NAME = "profile_kernel"
DESCRIPTION = """\
Profile one forward pass of a KernelBench problem's reference model, or of your candidate (a module
defining ModelNew), on the GPU with Nsight Compute. The model is built and warmed up first (compiles
and caches settle outside the measured range), then exactly one forward is profiled, kernel by kernel.
Returns a profile_id (pass it to classify_state next), the total GPU time and elapsed cycles, and the
heaviest kernels in launch order: name, grid/block, duration, share of the time, SM and memory
throughput (% of peak), DRAM throughput, occupancy and what limits it, the dominant warp stalls, and
the profiler's own findings with estimated speedups. Set detail=true for every kernel with all
metrics. Durations are taken at locked base clocks with flushed caches: use them to compare kernels,
not as speedups (compile_and_verify times candidates). A one-kernel candidate takes about 4-5 s on an
H100, the server's first call included: the server keeps a profiling process started (Python, torch,
CUDA) for the next call from its own start on; a call right after the server started waits for the
rest of that start-up, and one with source_counters or another max_kernels starts its own (about
10 s). Each further kernel launch adds about 1 s; a model with hundreds of launches takes minutes (run
it as a job then, or lower max_kernels). Without counter access the result has
counters_available=false, the reason, and timings only. Already have an
Nsight Compute report? Pass `report` (a .ncu-rep file, or its CSV export: raw page, details page or
both) instead: it is read as it is, nothing runs, no GPU needed, and the profile_id works the same.
Without a GPU (and without `report`) it answers at once with status needs_gpu, after checking the
problem and candidate files."""

META = ToolMeta(
    title="Profile a kernel under Nsight Compute",
    uses_gpu=True,
    # each call stores a new profile under a new profile_id
    idempotent=False,
)

TOP_STALLS = 3
TOP_FINDINGS = 3
MESSAGE_CHARS = 220


class Request(BaseModel):
    """What to profile, and how."""

    model_config = ConfigDict(extra="forbid")

    problem: Source | None = Field(
        None,
        description="KernelBench problem: its source text, or a path to a .py file on the server's machine (over HTTP "
                    "read only inside the folders the server's operator allows); with `report`: optional, names it"
    )
    candidate: Source | None = Field(
        None,
        description="candidate defining class ModelNew: its source text, or a path to a .py file on the server's "
                    "machine (over HTTP read only inside the operator's folders); omit to profile the reference"
    )
    detail: bool = Field(False, description="return every kernel with all metrics (large); default: the heaviest few")
    top: int = Field(8, ge=1, le=100,
                     description="kernels listed when detail is false (heaviest, shown in launch order)")
    counters: bool = Field(True, description="collect hardware counters; false gives per-kernel timings only (fast)")
    source_counters: bool = Field(False, description="also collect SASS-level source counters (more replay passes)")
    warmup: int = Field(2, ge=1, le=50, description="forward passes before the profiled one")
    max_kernels: int = Field(200, ge=1, le=5000, description="profile at most this many kernel launches")
    timeout_s: float = Field(300.0, gt=0, le=3600, description="stop profiling after this many seconds")
    keep_report: bool = Field(False, description="keep the Nsight Compute report file beside the profile (for the GUI)")
    report: list[str] | None = Field(
        None, description="instead of profiling: your own Nsight Compute report, a .ncu-rep path or the paths of its "
        "CSV export (`ncu --import R --csv --page raw` and/or `--page details`) on the server's machine (over HTTP "
        "read only inside the folders the server's operator allows)"
    )

    @field_validator("report", mode="before")
    @classmethod
    def _one_path(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _something_to_profile(self) -> Request:
        if self.problem is None and not self.report:
            raise ValueError("give problem (to profile it) or report (an existing .ncu-rep or its CSV export)")
        if self.report and self.candidate is not None:
            raise ValueError("candidate and report exclude each other: a report already says what ran")
        return self


class RuleSummary(BaseModel):
    """A profiler rule finding, shortened."""

    model_config = ConfigDict(extra="forbid")

    rule: str
    estimated_speedup_pct: float | None = None
    message: str


class KernelSummary(BaseModel):
    """One kernel instance, compactly."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="launch order within the profiled forward")
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    duration_us: float | None = None
    time_share: float = Field(0.0, description="share of the profile's total GPU time")
    sm_throughput_pct: float | None = None
    memory_throughput_pct: float | None = None
    dram_throughput_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    occupancy_limiter: str | None = None
    registers_per_thread: float | None = None
    top_stalls: dict[str, float] = Field(default_factory=dict, description="reason -> cycles per issued instruction")
    findings: list[RuleSummary] = Field(default_factory=list)
    full_name: str | None = Field(None, description="demangled signature (detail only)")
    metrics: KernelMetrics | None = Field(None, description="every metric (detail only)")


class Result(BaseModel):
    """The stored profile's id and a summary of it (or, without a GPU, why there is none)."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["profiled", "needs_gpu"] = Field(
        "profiled", description="needs_gpu: no GPU here, nothing was profiled (the summary says why)"
    )
    summary: str = ""
    profile_id: str | None = Field(None, description="pass to classify_state (None when status is needs_gpu)")
    problem: str
    candidate_id: str | None
    device: str = ""
    arch: str = ""
    method: str = Field("", description="'ncu' (hardware counters) or 'timeline' (timings only)")
    counters_available: bool = False
    counters_reason: str | None = None
    total_gpu_time_us: float = 0.0
    total_elapsed_cycles: float = 0.0
    kernel_count: int = 0
    kernels: list[KernelSummary] = Field(default_factory=list)
    omitted_kernels: int = Field(0, description="kernels not listed (lighter ones); detail=true lists all")
    notes: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(
        default_factory=list, description="sandbox_attempt: what the profiled code's processes (the driver, ncu) "
        "tried that the sandbox refuses; the profile stands, the owner of the server sees it in its log")
    report_file: str | None = None
    wall_s: float | None = None
    next_step: str = ""


def summarize(profile: Profile, *, detail: bool, top: int) -> tuple[list[KernelSummary], int]:
    """Kernel summaries in launch order: all with detail, else the `top` heaviest."""
    kernels = profile.kernels
    chosen = kernels
    if not detail and len(kernels) > top:
        heaviest = sorted(kernels, key=lambda k: -(k.metrics.duration_ns or 0.0))[:top]
        keep = {k.index for k in heaviest}
        chosen = [k for k in kernels if k.index in keep]
    total = profile.total_gpu_time_ns or 1.0
    return [_summary(k, total, detail) for k in chosen], len(kernels) - len(chosen)


def _summary(k: KernelProfile, total_ns: float, detail: bool) -> KernelSummary:
    m = k.metrics
    findings = sorted(k.findings, key=lambda f: -(f.estimated_speedup_pct or 0.0))
    if not detail:
        findings = findings[:TOP_FINDINGS]
    return KernelSummary(
        index=k.index,
        name=k.name,
        grid=k.grid,
        block=k.block,
        duration_us=round(m.duration_ns / 1e3, 3) if m.duration_ns is not None else None,
        time_share=round((m.duration_ns or 0.0) / total_ns, 4),
        sm_throughput_pct=_r(m.sm_throughput_pct),
        memory_throughput_pct=_r(m.memory_throughput_pct),
        dram_throughput_pct=_r(m.dram_throughput_pct),
        achieved_occupancy_pct=_r(m.achieved_occupancy_pct),
        theoretical_occupancy_pct=_r(m.theoretical_occupancy_pct),
        occupancy_limiter=m.occupancy_limiter,
        registers_per_thread=m.registers_per_thread,
        top_stalls=dict(list(m.warp_stalls.items())[:TOP_STALLS]) if not detail else dict(m.warp_stalls),
        findings=[RuleSummary(rule=f.rule, estimated_speedup_pct=f.estimated_speedup_pct,
                          message=f.message if detail else f.message[:MESSAGE_CHARS]) for f in findings],
        full_name=k.full_name if detail else None,
        metrics=m if detail else None,
    )


def _r(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


@on_gpu_lane(NAME)
def run(ctx: ToolContext, req: Request, progress: Progress = no_progress) -> Result:
    """Profiles (or reads the given report), stores the profile under a new profile_id, returns its summary."""
    if req.report:
        return _imported(ctx, req, progress)
    assert req.problem is not None  # the request's validator guarantees problem or report
    problem = read_problem(req.problem, ctx.files)
    candidate_source = None
    if req.candidate is not None:
        candidate = read_source(req.candidate, "candidate", ctx.files)
        try:
            parse_candidate(candidate.text, candidate.path or "<candidate>")
        except CandidateError as exc:
            raise ToolError(str(exc)) from exc
        candidate_source = candidate.text
    missing_gpu = no_gpu_reason()
    if missing_gpu is not None:
        return needs_gpu(problem, candidate_source, missing_gpu)
    store = ProfileStore(ctx.profiles_dir)
    profile_id = new_profile_id()
    options = profile_options(req)
    try:
        sandbox = ctx.sandbox
    except RuntimeError as exc:  # SandboxUnavailable: says what to do
        raise harness_unavailable(exc) from exc
    try:
        prof = profile(problem, candidate_source, profile_id=profile_id, report_base=store.report_base(profile_id),
                       cache_dir=ctx.cache_dir, options=options, progress=progress, standby=ctx.profilers,
                       sandbox=sandbox)
    except ProblemFailedError as exc:  # the problem's own code, before or without the candidate's
        raise problem_failed(problem, exc.failed.text, "nothing was profiled or stored.") from exc
    except NoGpuError as exc:
        return needs_gpu(problem, candidate_source, str(exc))
    except ProfilerError as exc:
        raise ToolError(str(exc)) from exc
    prof = _disclosable(prof, keep_report=req.keep_report)
    store.save(prof)
    progress(1, 1, f"profiled {len(prof.kernels)} kernel(s)")
    return _result(prof, req)


def profile_options(req: Request) -> ProfileOptions:
    """How a request profiles (what a waiting driver must have been started for)."""
    return ProfileOptions(warmup=req.warmup, counters=req.counters, source_counters=req.source_counters,
                          max_kernels=req.max_kernels, timeout_s=req.timeout_s)


def prewarm(ctx: ToolContext) -> Standby | None:
    """Starts a profiling driver in standby for a request that sets no options, so that the first
    profile of a server is warm too (`kb_mcp.server.prewarm` calls it as the server starts).

    It only starts the process: the driver imports torch and creates its CUDA context on its own
    and then waits, launching nothing until it is handed a spec. The GPU lane is held for the
    launch and that start-up (at most `PREWARM_LANE_S`): another process's timing beside a new CUDA
    context would be disturbed by it, as this process's are (`settle_profiler`).
    None when this context keeps no standby or the pool starts none (see `profiler.start_standby`).
    Raises SandboxUnavailable (a RuntimeError) where candidates cannot be confined.
    """
    pool = ctx.profilers
    if pool is None:
        return None
    options = profile_options(Request.model_construct())  # every field at its default, as a bare request
    with ctx.gpu_lane.hold("profiling driver warm-up"):
        standby = start_standby(pool, options, ctx.cache_dir, ctx.sandbox)
        if standby is not None:
            pool.wait_ready(PREWARM_LANE_S)
        return standby


PREWARM_LANE_S = 120.0  # a cold machine's first `import torch` can take a minute


def _disclosable(prof: Profile, *, keep_report: bool) -> Profile:
    """The profile as it may be stored and returned: every text redacted of secret values, and the
    ncu report kept only when asked for and free of them (a binary file cannot be redacted)."""
    report = Path(prof.report_file) if prof.report_file else None
    if report is not None and keep_report:
        try:
            leaked = secret_in(report.read_bytes())
        except OSError:
            leaked = None
        if leaked is not None:
            keep_report = False
            prof.notes.append(f"the ncu report was not kept: it contains {leaked} "
                              "(secret values never leave the server)")
    if report is not None and not keep_report:
        report.unlink(missing_ok=True)  # reports of big models run to tens of MB
        prof.report_file = None
    return redact_model(prof)


def _imported(ctx: ToolContext, req: Request, progress: Progress) -> Result:
    """A user's own report, read (never run) and stored like a profile of ours."""
    name = read_problem(req.problem, ctx.files).name if req.problem is not None else None
    files = [readable_file(ctx.files, path, "report") for path in req.report or []]
    progress(0, 1, "reading the report")
    try:
        prof = import_report(files, profile_id=new_profile_id(), problem=name)
    except ReportImportError as exc:
        raise ToolError(str(exc)) from exc
    prof = redact_model(prof)  # the user's report is stored like a profile of ours
    ProfileStore(ctx.profiles_dir).save(prof)
    progress(1, 1, f"read {len(prof.kernels)} kernel(s) from the report")
    return _result(prof, req)


def _result(prof: Profile, req: Request) -> Result:
    kernels, omitted = summarize(prof, detail=req.detail, top=req.top)
    return Result(
        summary=f"profiled {len(prof.kernels)} kernel(s) on {prof.device}"
        + (f" [flagged: sandbox_attempt: {prof.attempt}]" if prof.attempt else ""),
        profile_id=prof.profile_id,
        problem=prof.problem,
        candidate_id=prof.candidate_id,
        device=prof.device,
        arch=prof.arch,
        method=prof.method,
        counters_available=prof.counters_available,
        counters_reason=prof.counters_reason,
        total_gpu_time_us=round(prof.total_gpu_time_ns / 1e3, 3),
        total_elapsed_cycles=prof.total_elapsed_cycles,
        kernel_count=len(prof.kernels),
        kernels=kernels,
        omitted_kernels=omitted,
        notes=prof.notes,
        findings=[Finding(code=FindingCode.sandbox_attempt, source="sandbox", message=prof.attempt)] if prof.attempt
        else [],
        report_file=prof.report_file,
        wall_s=round(prof.wall_s, 2) if prof.wall_s is not None else None,
        next_step=f"call classify_state with profile_id={prof.profile_id} to map the kernels to KB states",
    )


def needs_gpu(problem: Problem, candidate_source: str | None, reason: str) -> Result:
    """The answer without a GPU: nothing profiled, and what to do instead."""
    return Result(
        status="needs_gpu",
        summary=f"not profiled: {reason}",
        problem=problem.name,
        candidate_id=candidate_id(problem, candidate_source) if candidate_source is not None else None,
        method="none",
        counters_reason="no GPU",
        next_step="profile on a machine with an NVIDIA GPU, or pass `report` with an Nsight Compute report "
        "made there; here, classify_state accepts metrics you already have, and suggest_optimizations "
        "works from a state id",
    )
