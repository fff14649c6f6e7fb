"""Every message between the server side of the harness and the processes that run untrusted code.

The server side (the worker pool, the build service, the profiler) never imports torch or a
candidate; the worker side (`harness.worker`: verify and census workers, the build process, the
profiling driver) runs inside the sandbox (`harness.sandbox.sandbox`) and only answers. These models are
the whole vocabulary between the two, so each side validates what it reads and nothing travels
as an untyped dict.

Over the worker channel (`harness.sandbox.channel`: length-prefixed JSON frames, HMAC-signed, numbered):

* pool -> worker, signed with `channel.POOL_KEY`: `Init` (the session key), then one request at
  a time (`VerifyRequest`, `CensusRequest`, `BaselineRequest`, `ProblemRequest`, `PingRequest`,
  `ExitRequest`) and
  the answers to what the worker asks mid-request (`CensusAnswer`, `BuildAnswer`).
* worker -> pool, signed with the request's own key and numbered from 0: `Phase` (progress),
  `CensusAsk` and `BuildAsk` (the worker waits for the answer), then one `ResultFrame` whose body is
  the reply to the request, or `ProblemFailed` when the problem itself would not load.
  `Hello` (signed with the session key) opens the conversation.

Through files in the sandbox's scratch folder (written whole, then renamed):

* the build process: `BuildSpec` in, `BuildReport` out;
* the profiling driver: `DriverSpec` in, `DriverReport` out (plus ncu's own report).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from kb_mcp.harness.baselines import Baseline
from kb_mcp.harness.candidate import SourceUnit
from kb_mcp.harness.gpu.memory import Footprint, TooLarge
from kb_mcp.harness.judgment.kernels import DeviceTime
from kb_mcp.harness.judgment.precision import PrecisionEvidence
from kb_mcp.harness.judgment.verdict import Evidence, Failure, Finding, Judgement, VerifyOptions, VerifyResult, judge
from kb_mcp.harness.plausibility import WorkCensus
from kb_mcp.harness.problem import Problem
from kb_mcp.kb.models import Verdict

__all__ = [
    "BaselineReply", "BaselineRequest",
    "BuildAnswer", "BuildAsk", "BuildReply", "BuildReport", "BuildSpec", "CensusAnswer", "CensusAsk",
    "CensusReply", "CensusRequest", "DriverReport", "DriverSpec", "ExitRequest",
    "FROM_WORKER", "Hello", "Init", "PingReply", "PingRequest", "Phase", "ProblemChecked", "ProblemFailed",
    "ProblemRequest", "ResultFrame", "TO_WORKER",
    "VerifyReply", "VerifyRequest", "WorkerInfo",
]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------------------
# Worker start


class WorkerInfo(_Message):
    """What a worker says of itself once torch (and CUDA, where present) is up."""

    pid: int  # as the pool sees it (the sandbox's outer process); the pool fills it in
    sandbox_pid: int = 0  # the worker's own pid inside its sandbox
    role: Literal["verify", "census"] = "verify"
    cuda: bool = False
    device: str = ""
    arch: str = ""
    torch_version: str = ""
    python: str = ""
    uuid: str = ""  # the GPU's UUID as the driver names it ("GPU-..."), where torch reports it


class Init(_Message):
    """The first frame to a worker: the key its `Hello` is signed with."""

    kind: Literal["init"] = "init"
    key: str


class Hello(_Message):
    """The worker is ready."""

    kind: Literal["hello"] = "hello"
    info: WorkerInfo


# ---------------------------------------------------------------------------------------------
# Requests (pool -> worker)


class _Request(_Message):
    rid: str  # request id: every frame of the answer carries it
    key: str  # hex key the answer's frames are signed with (fresh per request)


class VerifyRequest(_Request):
    """Check and time one candidate (GPU workers)."""

    kind: Literal["verify"] = "verify"
    problem: Problem
    source: str
    options: VerifyOptions
    candidate_id: str
    # the problem's baselines as the pool has them (cached, or timed just now before the candidate in
    # a worker no candidate ran in); None: the worker times eager beside the candidate, no torch.compile
    baseline: Baseline | None = None


class CensusRequest(_Request):
    """One forward of a candidate under the profiler (census workers), then its device time; with
    `reference_device`, the reference's device time first (before any candidate code runs there)."""

    kind: Literal["census"] = "census"
    problem: Problem
    source: str
    options: VerifyOptions
    candidate_id: str
    reference_device: bool = False  # the pool asks for it where the cached baseline lacks it
    # Composed mode: the reference's own kernel-launching ops too (`harness.judgment.composed`), where none are cached
    reference_ops: bool = False


class BaselineRequest(_Request):
    """Time the problem's eager and torch.compile baselines alone, without a candidate (`kb-mcp eval
    --baselines`; `harness.worker.baseline_run`)."""

    kind: Literal["baseline"] = "baseline"
    problem: Problem
    options: VerifyOptions


class ProblemRequest(_Request):
    """Import the problem and make its init inputs (the compile-only path runs nothing else)."""

    kind: Literal["problem"] = "problem"
    problem: Problem


class PingRequest(_Request):
    """What the worker says of itself now."""

    kind: Literal["ping"] = "ping"


class ExitRequest(_Message):
    """Exit now."""

    kind: Literal["exit"] = "exit"


# ---------------------------------------------------------------------------------------------
# What a worker asks mid-request, and the answers


class CensusReply(_Message):
    """The census worker's answer on one candidate, as the pool hands it to the verify worker."""

    kind: Literal["census"] = "census"
    census: dict[str, Any] | None = None  # an `integrity_runtime.KernelCensus`, as JSON
    findings: list[Finding] = Field(default_factory=list)  # the census worker's own integrity findings
    # Set when no census could be taken (the census worker's or the pool's account of how it
    # ended); `verdict.judge` words it, as it does every other ending.
    failure: Failure | None = None
    pid: int | None = None  # the census worker that answered (its pid inside its sandbox)
    elapsed_s: float = 0.0
    peak_bytes: int | None = None  # the most its allocator reserved during the census
    work: WorkCensus | None = None  # the answer to a `CensusAsk(counters=True)` (`profiling.work`)
    # What the SASS of the candidate's builds shows (`harness.judgment.precision`), read by the server in the
    # sandbox and added by the pool: the verify worker judges it against the track and the dtypes.
    precision: PrecisionEvidence | None = None
    # The device time of the candidate's forward (after the census), and of the reference's where
    # the request asked for it (`kernels.DeviceTime`; measured there, never in the verify worker).
    device: DeviceTime | None = None
    reference_device: DeviceTime | None = None
    # Composed mode: the PyTorch ops that launched the reference's kernels (`harness.judgment.composed`; the
    # census worker's where asked, else the pool's cache); None where unknown.
    reference_ops: list[str] | None = None

    @property
    def judgement(self) -> Judgement | None:
        """How no census could be taken, judged (`verdict.judge`: crashed, timeout or invalid); None
        when one was."""
        return None if self.failure is None else judge(Evidence(findings=self.findings, failure=self.failure))

    @property
    def verdict(self) -> Verdict | None:
        """The judgement's verdict, or None when a census was taken."""
        return None if self.judgement is None else self.judgement.verdict

    @property
    def summary(self) -> str:
        """The judgement's summary, or empty when a census was taken."""
        return "" if self.judgement is None else self.judgement.summary

    @property
    def clean(self) -> bool:
        """True when the census ran and the census worker saw nothing wrong."""
        return self.failure is None and not self.findings


class BuildReply(_Message):
    """The build service's answer: the extension is in the shared cache, or why not."""

    ok: bool
    ext: str = ""  # the extension's name in the cache (`toolchain.extension_name`)
    light: bool = False  # built without torch/types.h
    log: str = ""  # compiler output (truncated) on failure, a note on success
    seconds: float = 0.0
    cached: bool = False  # someone had built it already
    refused: str = ""  # why the server refused to build it (a flag or include outside the allow-list)


class _Ask(_Message):
    rid: str
    seq: int


class Phase(_Ask):
    """The worker moved on to `phase` (progress, and the pool's limit for it)."""

    kind: Literal["phase"] = "phase"
    phase: str


class CensusAsk(_Ask):
    """The candidate passed the checks: the worker waits for its kernel census. With `counters`
    (an escalated result), for its work census instead: hardware counters of one forward."""

    kind: Literal["census_ask"] = "census_ask"
    counters: bool = False
    units: list[SourceUnit] = Field(default_factory=list, max_length=64)  # what the candidate built (its SASS is read)


class BuildAsk(_Ask):
    """The candidate called `load_inline` with sources not in the shared cache: please build them."""

    kind: Literal["build_ask"] = "build_ask"
    unit: SourceUnit
    arch: str


class CensusAnswer(_Message):
    """The census for request `rid`."""

    kind: Literal["census_answer"] = "census_answer"
    rid: str
    reply: CensusReply


class BuildAnswer(_Message):
    """The build for request `rid`."""

    kind: Literal["build_answer"] = "build_answer"
    rid: str
    reply: BuildReply


# ---------------------------------------------------------------------------------------------
# Results (worker -> pool)


class VerifyReply(_Message):
    """The verdict, and a baseline measured for the shared cache (the server decides whether to keep it)."""

    kind: Literal["verify"] = "verify"
    result: VerifyResult
    baseline: Baseline | None = None
    # Composed mode: the reference's own ops as the op recorder saw them, recorded in this run for
    # the cache (`harness.judgment.composed.ReferenceOpsCache`; the server stores them)
    reference_ops: list[str] | None = None


class BaselineReply(_Message):
    """The answer to a `BaselineRequest`: the baseline (None where the problem is too large), the
    problem's footprint and the peak the worker's allocator reserved."""

    kind: Literal["baseline"] = "baseline"
    baseline: Baseline | None = None
    footprint: Footprint
    too_large: TooLarge | None = None
    peak_bytes: int | None = None
    elapsed_s: float = 0.0
    # seconds per step, in order: load (import, footprint), construct, eager (its peak run and series),
    # compile (torch.compile's first call: tracing, code generation, autotuning), compile_timed
    phases: dict[str, float] = Field(default_factory=dict)


class PingReply(_Message):
    """The worker's start-up info and how many profiler sessions the harness started in it."""

    kind: Literal["ping"] = "ping"
    info: WorkerInfo
    profiler_sessions: int = 0


class ProblemChecked(_Message):
    """The problem imports and makes its init inputs."""

    kind: Literal["problem_ok"] = "problem_ok"


class ProblemFailed(_Message):
    """The problem's own code failed (import, `Model` construction, its inputs, or its `Model` raising
    later on inputs of its own distribution, with no frame of the candidate's in the traceback): no
    candidate is to blame."""

    kind: Literal["problem_failed"] = "problem_failed"
    stage: Literal["import", "construct", "inputs", "forward", "reference", "too_large"]
    error: str
    too_large: TooLarge | None = None  # stage too_large: the numbers (`harness.gpu.memory`)

    @property
    def text(self) -> str:
        """What failed, as `VerifyResult.problem_error` says it."""
        if self.too_large is not None:
            return self.too_large.text
        what = {"import": "its module failed to import", "construct": "its Model failed to construct",
                "inputs": "its inputs failed", "forward": "its Model's forward failed",
                "reference": "its Model raised on an input set of its own",
                "too_large": "it is too large for this GPU"}[self.stage]
        return f"{what}: {self.error}"


ResultBody = Annotated[
    VerifyReply | CensusReply | BaselineReply | PingReply | ProblemChecked | ProblemFailed, Field(discriminator="kind")
]


class ResultFrame(_Ask):
    """The last frame of a request's answer."""

    kind: Literal["result"] = "result"
    retire: bool = False  # the worker exits after this (it may have been left unfit)
    why_retire: str = ""  # what left it unfit, where the worker itself saw it (a thread or process left running)
    body: ResultBody


FROM_WORKER: TypeAdapter[Any] = TypeAdapter(
    Annotated[Hello | Phase | CensusAsk | BuildAsk | ResultFrame, Field(discriminator="kind")]
)
TO_WORKER: TypeAdapter[Any] = TypeAdapter(
    Annotated[
        Init | VerifyRequest | CensusRequest | BaselineRequest | ProblemRequest | PingRequest | ExitRequest
        | CensusAnswer | BuildAnswer,
        Field(discriminator="kind"),
    ]
)


# ---------------------------------------------------------------------------------------------
# The build process (files in its scratch folder)


class BuildSpec(_Message):
    """What the build process compiles: one `load_inline` unit, already checked against the allow-lists."""

    unit: SourceUnit
    arch: str  # e.g. sm_90: the only arch built
    out_dir: str  # where the build happens and the `.so` is left
    report_path: str  # where the BuildReport goes


class BuildReport(_Message):
    """What the build process did."""

    ok: bool
    ext: str = ""
    light: bool = False
    so_path: str = ""  # the built library, inside out_dir
    log: str = ""
    seconds: float = 0.0


# ---------------------------------------------------------------------------------------------
# The profiling driver (files in its scratch folder)

NVTX_RANGE = "kbmcp"  # the one profiled forward runs inside this NVTX range
# Exit codes the profiler reads (besides the report file).
EXIT_OK, EXIT_USER_CODE, EXIT_NO_GPU, EXIT_BAD_SPEC, EXIT_UNCLAIMED = 0, 2, 3, 4, 5
# Standby rendezvous: the profiler writes SPEC_FILE atomically; the driver claims it by renaming
# it to CLAIMED_FILE, so the profiler can tell "the standby ran my spec" from "it had already gone".
SPEC_FILE, CLAIMED_FILE = "spec.json", "claimed.json"
READY_FILE = "ready"  # written by a standby driver once torch and CUDA are up


class DriverSpec(_Message):
    """What the driver runs: written by the profiler as JSON, read by the driver."""

    problem_source: str
    problem_module: str  # unique module name for the problem file
    candidate_source: str | None = None
    candidate_module: str | None = None
    mode: Literal["ncu", "timeline"] = "ncu"
    warmup: int = 2
    seed: int = 0
    workdir: str  # where sources are written and imported from
    report_path: str  # where the DriverReport JSON goes
    trace_path: str | None = None  # timeline mode: the Chrome trace
    cache_dir: str | None = None  # the shared cache: published builds are loaded from it (read-only)


class DriverReport(_Message):
    """What the driver tells the profiler: the device, and what went wrong if anything did."""

    ok: bool
    # where it failed: load_problem, device, load_candidate, init_inputs, build, inputs, warmup, forward
    stage: str = ""
    error: str | None = None  # message plus the traceback's tail, for the agent
    device: str = ""
    arch: str = ""
    torch_version: str = ""
    warmup_s: float | None = None  # wall time of the warm-up (includes lazy compiles)
    forward_s: float | None = None  # wall time of the profiled forward (inflated under ncu)
    trace_path: str | None = None
    phases_s: dict[str, float] = {}  # seconds per phase: import_torch, cuda_init, load, build, warmup, forward
