"""The worker pool (server side): candidates run in sandboxed worker processes, never in the caller's.

`WorkerPool.verify(problem, source, options, progress) -> VerifyResult` sends one candidate to a
warm worker (`harness.pool.process`: torch and CUDA initialised once, started through
`harness.sandbox.sandbox`) over a private socket pair, and waits for the answer with a limit per phase
(build, checks, timing, baselines). A worker that hangs is killed at the limit (verdict
`timeout`); one that dies (segfault, abort, `os._exit`, out-of-memory kill) yields `crashed` with
how it ended; one that says it is unfit after a candidate (CUDA error, tampering, leftover thread
or process) exits. In every case a replacement is started at once, so the next candidate finds a
warm worker. This module schedules the requests (routing, phases, lane holds, results); the worker
processes' lifecycle (start, spare, retirement, replacement, health) is `harness.pool.workers`'.

Only this side writes anything shared: builds a worker asks for are made by the build service
(`harness.builds.builds`) and published read-only; a baseline a worker measured is checked and stored
here; the KB and artifacts are the tools' business. Frames on the channel are authenticated per
request (see `harness.sandbox.channel`); a frame that fails, arrives out of order or disagrees with the
request ends the request as `invalid` with `forged_result`. The pool words no verdict itself: each
of these endings is a typed `verdict.Failure` that `verdict.judge` decides, as it decides the
worker's own evidence.

Timing happens in a process that has never started a profiler session: the kernel census, which
needs one, runs in a census worker of its own (`harness.worker.census`). A verify worker that
reaches the census asks the pool and waits; the pool asks the census worker, waits until no
worker of the pool is still starting up, and only then answers, so that nothing else of the
harness runs while the verify worker times. Each request holds the machine-wide GPU lane (before the
pool's own lock, `harness.gpu.lane`): no other kb-mcp process measures on that GPU meanwhile either.
It holds it for the GPU work only: the candidate's static checks and its `load_inline` builds
(`harness.builds.ahead`, the eval's build-ahead service) run before the lane is taken, so other requests
(threads, or other processes on the machine) build while one times; the result says how long it
waited for the lane and held it (`VerifyResult.lane`, beside `phases_s`).

Without a GPU (or with `options.compile_only`) nothing of the candidate runs: its CUDA sources
are read statically and compiled in the sandbox (`harness.builds.compile_only`), without the lane, beside
other requests' compiles.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kb_mcp.harness.attempt_findings import with_attempts
from kb_mcp.harness.baselines import Baseline, BaselineCache, BaselineRun, ReferenceOpsCache, not_cached
from kb_mcp.harness.builds.ahead import BuildsAhead, target_for
from kb_mcp.harness.builds.builds import BuildService
from kb_mcp.harness.builds.compile_only import CompileOnly
from kb_mcp.harness.candidate import CandidateError, parse_candidate, static_units, style_of
from kb_mcp.harness.gpu import lane
from kb_mcp.harness.gpu.gpu_memory import DeviceMemory
from kb_mcp.harness.gpu.gpu_probe import no_gpu_reason
from kb_mcp.harness.gpu.lane_use import LaneUse
from kb_mcp.harness.judgment.verdict import (
    CompileResult,
    Evidence,
    Failure,
    FailureKind,
    Finding,
    FindingCode,
    VerifyOptions,
    VerifyResult,
    judge,
)
from kb_mcp.harness.phases import PHASE_WORDS, PHASES, PhaseClock
from kb_mcp.harness.pool.baseline_side import BaselineSide
from kb_mcp.harness.pool.census_side import CensusSide
from kb_mcp.harness.pool.process import ReplyReader, WorkerError, WorkerProcess, describe_exit, following
from kb_mcp.harness.problem import Problem, candidate_id
from kb_mcp.harness.protocol import (
    BuildAnswer,
    BuildAsk,
    CensusAsk,
    ProblemChecked,
    ProblemFailed,
    ProblemRequest,
    VerifyReply,
    VerifyRequest,
)
from kb_mcp.harness.sandbox.attempts import AttemptLog, collecting
from kb_mcp.harness.sandbox.channel import POOL_KEY, ChannelClosed, ForgedFrame, new_key, send
from kb_mcp.harness.sandbox.sandbox import Sandbox
from kb_mcp.kb.models import Verdict
from kb_mcp.kb.progress import Progress, no_progress

__all__ = ["PHASES", "WorkerError", "WorkerPool", "describe_exit", "no_progress"]


class WorkerPool(BaselineSide, CensusSide):
    """A warm harness worker (one: candidates share one GPU) and the requests sent to it.

    Besides the active worker the pool keeps a spare (same role, no candidate until a fault makes it
    the active one; once the active worker has served a candidate, the spare times the baselines,
    `harness.pool.baseline_side`) and a census worker (`harness.worker.census`), started once the first worker says
    it has a GPU (elsewhere on first use). Thread-safe: concurrent `verify` calls are served one
    after another. `sandbox` defaults to `harness.sandbox.sandbox.detect()` (which refuses where no
    confinement is possible and `KB_MCP_SANDBOX=unconfined` was not set).
    """

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        *,
        start_timeout_s: float = 300.0,
        no_cuda: bool = False,
        sandbox: Sandbox | None = None,
        prestart: bool = False,
        spare: bool = True,
    ) -> None:
        super().__init__(cache_dir, start_timeout_s=start_timeout_s, no_cuda=no_cuda, sandbox=sandbox, spare=spare)
        self.builds = BuildService(self.cache_dir, self.sandbox)
        self.compile_only = CompileOnly(self.cache_dir, self.sandbox)
        # Called holding the lane before a GPU request: what else of this process must be still meanwhile
        # (a tool context waits there for a profiling driver still starting up).
        self.settle: Callable[[], None] = lambda: None
        # (problem hash, track) whose reference device time a clean census found unknown (not asked again)
        self._reference_device_unknown: set[tuple[str, str]] = set()
        if prestart:
            self._spawn()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ----------------------------------------------------------------------------

    def verify(
        self,
        problem: Problem,
        source: str,
        options: VerifyOptions | None = None,
        progress: Progress = no_progress,
    ) -> VerifyResult:
        """Compiles, checks and times `source` against `problem` in a sandboxed worker; never raises
        for a misbehaving candidate (its verdict says what happened). A problem whose own code fails
        gives a result with `problem_error` set (no verdict on the candidate). Raises WorkerError
        when no worker can be started at all."""
        opts = options or VerifyOptions()
        cid = candidate_id(problem, source)
        t0 = time.monotonic()
        try:
            parse_candidate(source)
        except CandidateError as exc:
            return _judged(problem, cid, Evidence(compile=CompileResult(ok=False, messages=[str(exc)]),
                                                  failure=Failure(kind=FailureKind.malformed, detail=str(exc))),
                           phase="static", track=opts.track)
        with collecting() as seen:
            # The worker is started first (under the lane where a GPU may be visible: its CUDA start-up),
            # whatever the request; a compile-only one then compiles beside the others, without the lane.
            if self.no_cuda or not self._gpu_worker(progress) or opts.compile_only:
                result = self._compile_only(problem, source, opts, cid, progress, t0)
            else:
                result = self._on_lane(problem, source, opts, cid, progress, t0, seen)
        return self._marked(with_attempts(result, seen), opts)

    def _on_lane(self, problem: Problem, source: str, opts: VerifyOptions, cid: str, progress: Progress,
                 t0: float, seen: AttemptLog) -> VerifyResult:
        """A GPU verification: its units built before the lane, then its GPU work under it, what the
        candidate's processes try meanwhile reported to `seen`; the result says how it used the lane."""
        built = self._build_first(source, opts, progress)
        tb = time.monotonic()
        with lane.hold(f"verify {problem.name}", progress) as held, self._lock, \
                following(seen, self._worker, self._census):
            tl = time.monotonic()
            w = self._ready()
            if not (w.info and w.info.cuda):
                failed = self._check_problem(w, problem, opts)
                result = (self._problem_result(problem, cid, failed, t0) if failed is not None
                          else self.compile_only.verify(problem, source, opts, cid, progress))
            else:
                self.settle()
                tf = time.monotonic()
                first = self._baselines_first(problem, opts, progress)
                w = self._ready()
                if w.reader.pending():
                    # Bytes nobody asked for: a previous candidate left something writing to the channel.
                    self._replace(w)
                    w = self._ready()
                self._census_ahead(w, problem, opts)
                before = [("build_first", t0)] * built + [("lane", tb), ("queued", tl)]
                with DeviceMemory(w.info.uuid if w.info else "") as device:
                    result = self._request(w, problem, source, opts, cid, progress, t0,
                                           given=first.baseline if first else None, first=(tf, time.monotonic()),
                                           before=before)
                result = _with_first_baselines(result, first)
                result = _with_device_memory(result, device)
                self._settle_starts()  # a worker started meanwhile starts CUDA under the lane, not beside others
            # held from its entry (`since`, the wall clock as it was taken), the wait for the pool's lock included
            use = LaneUse().add(held.waited_s, time.time() - held.since, held.place, held.gpu, held.machine)
        return result.model_copy(update={"lane": use})

    def _gpu_worker(self, progress: Progress) -> bool:
        """Whether the active worker has a GPU to verify on. The first request of a pool starts it
        (its CUDA start-up is GPU work: under the lane where a GPU may be visible)."""
        w = self._worker
        if w is not None and w.info is not None and w.alive():
            return w.info.cuda
        on_gpu = no_gpu_reason() is None
        with lane.hold("start the harness worker", progress) if on_gpu else contextlib.nullcontext(), self._lock:
            info = self._ready().info
        return bool(info and info.cuda)

    def _compile_only(self, problem: Problem, source: str, opts: VerifyOptions, cid: str, progress: Progress,
                      t0: float) -> VerifyResult:
        """Compile-only (no GPU, or asked for): the problem checked in the worker, then the candidate's
        sources compiled in the sandbox; nothing runs on a GPU, so the lane is not taken and other
        requests' compiles run beside it."""
        with self._lock:
            failed = self._check_problem(self._ready(), problem, opts)
        if failed is not None:
            return self._problem_result(problem, cid, failed, t0)
        result = self.compile_only.verify(problem, source, opts, cid, progress)
        return result.model_copy(update={"lane": LaneUse()})

    def _build_first(self, source: str, opts: VerifyOptions, progress: Progress) -> bool:
        """Builds the candidate's certain `load_inline` units (`harness.builds.ahead`) before the lane is
        taken, so its worker finds them published; whether there were any. What is computed at run
        time, or fails here, the worker asks for again under the lane, as always."""
        w = self._worker
        info = w.info if w is not None else None
        if info is None or not info.cuda:  # compile-only requests compile outside the lane anyway
            return False
        ahead = BuildsAhead(self.cache_dir, self.sandbox, target_for(info, opts, self.no_cuda), opts.compile_timeout_s)
        if not ahead.units(source):
            return False
        progress(PHASES.index("import"), len(PHASES), PHASE_WORDS["build_first"])
        ahead.build(source)
        return True

    def _marked(self, result: VerifyResult, opts: VerifyOptions) -> VerifyResult:
        """Names the track it was verified in; an unconfined run says so in its summary and is held for review."""
        result = result.model_copy(update={"track": opts.track})
        if self.sandbox.confined:
            return result
        return result.model_copy(update={"flagged": True, "summary": f"{result.summary} [{self.sandbox.describe()}]"})

    def _limit(self, phase: str, opts: VerifyOptions) -> float:
        if phase in ("queued", "static", "import", "construct", "compile"):
            return opts.compile_timeout_s
        if phase == "baselines":
            return max(600.0, opts.timeout_s)
        return opts.timeout_s

    def _request(self, w: WorkerProcess, problem: Problem, source: str, opts: VerifyOptions, cid: str,
                 progress: Progress, t0: float, *, given: Baseline | None = None,
                 first: tuple[float, float] | None = None,
                 before: list[tuple[str, float]] | None = None) -> VerifyResult:
        """One verification on `w` with the pool's baselines `given`; `first` is when they were
        looked up or timed (their own phase of the result's `phases_s`), `before` the phases before
        the request (the build first, the wait for the lane: each from its time to the next)."""
        rid = uuid.uuid4().hex
        key = new_key()
        w.output.reset()
        w.served += 1  # from now on a candidate ran there: no baselines are timed in it (`_candidate_free`)
        self._send(w, VerifyRequest(rid=rid, key=key.hex(), problem=problem, source=source, options=opts,
                                    candidate_id=cid, baseline=given))
        steps = len(PHASES)
        clock = PhaseClock(t0, before[0][0] if before else "queued")
        for phase, at in (before or [])[1:]:
            clock.enter(phase, at)
        if first is not None:
            clock.enter("reference_baselines", first[0])
            clock.enter("queued", first[1])

        def on_phase(phase: str) -> None:
            clock.enter(phase, time.monotonic())
            progress(PHASES.index(phase) if phase in PHASES else 0, steps, PHASE_WORDS.get(phase, phase))

        def on_ask(ask: Any) -> None:
            if isinstance(ask, CensusAsk) and ask.counters:
                progress(PHASES.index("evidence"), steps, "counting the candidate's work under Nsight Compute")
                self._answer_work(w, rid, problem, source, opts)
            elif isinstance(ask, CensusAsk):
                progress(PHASES.index("census"), steps, PHASE_WORDS["census"])
                self._answer_census(w, rid, problem, source, opts, cid, ask.units)
            else:
                progress(PHASES.index("import"), steps, f"building {ask.unit.name} (load_inline) in the build sandbox")
                self._answer_build(w, rid, ask, opts.compile_timeout_s)

        reply = ReplyReader(w, rid, key, lambda phase: self._limit(phase, opts), "request")
        try:
            frame = reply.read(on_phase, on_ask)
            body = frame.body
            if isinstance(body, ProblemFailed):
                self._replace(w)  # the problem's code ran there
                return self._problem_result(problem, cid, body, t0)
            if not isinstance(body, VerifyReply):
                raise ForgedFrame(f"a {body.kind!r} result arrived for a verify request")
            result, retire = body.result, frame.retire
            if result.candidate_id != cid or result.problem_hash != problem.hash:
                raise ForgedFrame("the result names another candidate or problem than the one sent")
        except TimeoutError:
            phase = reply.phase
            return self._ended(w, problem, source, opts, cid, t0, phase, Failure(
                kind=FailureKind.timed_out, where=PHASE_WORDS.get(phase, phase), limit_s=self._limit(phase, opts)))
        except ChannelClosed:
            phase = reply.phase
            code = w.proc.wait(timeout=30)
            return self._ended(w, problem, source, opts, cid, t0, phase, Failure(
                kind=FailureKind.worker_died, where=PHASE_WORDS.get(phase, phase), detail=describe_exit(code)))
        except (ForgedFrame, ValidationError) as exc:
            finding = Finding(
                code=FindingCode.forged_result, source="runtime",
                message=(f"the result channel carried data the harness did not send ({exc}); writing to the "
                         "worker's channel or faking its messages is not allowed"),
            )
            return self._ended(w, problem, source, opts, cid, t0, reply.phase, Failure(kind=FailureKind.forged_frame),
                               [finding])
        result = self._keep_baseline(body, w, problem, opts.track.value)
        self._keep_reference_ops(body, w, problem, opts.track.value)
        w.output.settle()
        end = time.monotonic()
        result = result.model_copy(update={
            "output": w.output.take(opts.max_output_chars),
            "elapsed_s": round(end - t0, 3),
            "phases_s": clock.seconds(end),
            "worker_replaced": retire,
        })
        if retire:
            self._replace(w)
        progress(steps, steps, result.verdict.value)
        return result

    def _check_problem(self, w: WorkerProcess, problem: Problem, opts: VerifyOptions) -> ProblemFailed | None:
        """Whether the problem imports and makes its init inputs, in the worker (compile-only runs
        nothing of the candidate, but a broken problem is still named as such)."""
        rid, key = uuid.uuid4().hex, new_key()
        self._send(w, ProblemRequest(rid=rid, key=key.hex(), problem=problem))
        reply = ReplyReader(w, rid, key, lambda phase: opts.compile_timeout_s, "problem check")
        try:
            frame = reply.read(lambda phase: None, lambda ask: None)
            body = frame.body
            if frame.retire:
                self._replace(w)
        except TimeoutError:
            self._replace(w)
            return ProblemFailed(stage="import", error=f"no answer within {opts.compile_timeout_s:.0f} s")
        except ChannelClosed:
            code = w.proc.wait(timeout=30)
            self._replace(w)
            return ProblemFailed(stage="import", error=f"the worker importing it died ({describe_exit(code)})")
        except (ForgedFrame, ValidationError) as exc:
            self._replace(w)
            return ProblemFailed(stage="import", error=f"its import wrote to the harness's channel ({exc})")
        if isinstance(body, ProblemFailed):
            return body
        if not isinstance(body, ProblemChecked):
            self._replace(w)
            return ProblemFailed(stage="import", error=f"the worker answered {body.kind!r}")
        return None

    @staticmethod
    def _problem_result(problem: Problem, cid: str, failed: ProblemFailed, t0: float) -> VerifyResult:
        """The result when the problem's own code failed: no verdict on the candidate (the tool stores none)."""
        return _judged(problem, cid, Evidence(failure=Failure(kind=FailureKind.problem_failed, detail=failed.text)),
                       phase="import", problem_error=failed.text, too_large=failed.too_large,
                       elapsed_s=round(time.monotonic() - t0, 3))

    def _keep_baseline(self, body: VerifyReply, w: WorkerProcess, problem: Problem, track: str) -> VerifyResult:
        """Stores a measured baseline under the key the server knows (this problem, the worker's GPU and torch
        as it said at start, never one the worker names) if it held the GPU alone; else the result says why."""
        base, info, held, result = body.baseline, w.info, lane.current(), body.result
        if base is None or info is None or result.verdict in (Verdict.invalid, Verdict.crashed):
            return result
        if held is None or not held.alone:
            why = not_cached(held.why_not if held else "the GPU lane was not held")
            return result.model_copy(update={"timings": result.timings and result.timings.model_copy(
                update={"baseline_not_cached": why})})
        BaselineCache(self.cache_dir).put(base.model_copy(update={
            "problem_hash": problem.hash, "device": info.device, "torch_version": info.torch_version, "track": track}))
        return result

    def _keep_reference_ops(self, body: VerifyReply, w: WorkerProcess, problem: Problem, track: str) -> None:
        """Stores the reference's op set the verify worker recorded (composed mode, `harness.judgment.composed`)
        under the key the server knows. It was recorded before any candidate code ran there."""
        if body.reference_ops is not None and w.info is not None:
            ReferenceOpsCache(self.cache_dir).add(problem.hash, w.info.device, w.info.torch_version, track,
                                                  dispatch=body.reference_ops)

    def _answer_build(self, w: WorkerProcess, rid: str, ask: BuildAsk, timeout_s: float) -> None:
        """Builds what a worker's `load_inline` asked for (in a sandbox of its own) and answers."""
        info = w.info
        reply = self.builds.build(ask.unit, (info.arch if info else "") or ask.arch,
                                  info.torch_version if info else "", timeout_s)
        try:
            send(w.sock, BuildAnswer(rid=rid, reply=reply), POOL_KEY)
        except OSError:
            pass  # the worker is gone: the next read says how

    def _ended(self, w: WorkerProcess, problem: Problem, source: str, opts: VerifyOptions, cid: str, t0: float,
               phase: str, failure: Failure, findings: list[Finding] | None = None) -> VerifyResult:
        """The result when the worker did not answer properly: it is replaced; `judge` words why."""
        self._replace(w)
        w.output.settle()
        built = phase in ("check", "census", "probes", "timing", "baselines")
        compile = CompileResult(
            ok=built,
            style=style_of(static_units(source)),
            messages=[] if built else ["the build did not finish: the worker ended while "
                                       f"{PHASE_WORDS.get(phase, phase)}"],
        )
        # The GPU it ran on: a timeout or crash there is a GPU verdict, stored as one (its verdict key
        # and strength depend on it), not a compile-only one.
        gpu = w.info is not None and w.info.cuda and not self.no_cuda and not opts.compile_only
        return _judged(
            problem, cid, Evidence(compile=compile, findings=findings or [], failure=failure),
            phase=phase, output=w.output.take(opts.max_output_chars),
            elapsed_s=round(time.monotonic() - t0, 3), worker_replaced=True,
            device=w.info.device if gpu and w.info else "", arch=w.info.arch if gpu and w.info else "",
        )


def _with_first_baselines(result: VerifyResult, first: BaselineRun | None) -> VerifyResult:
    """A verdict whose baselines the pool timed just before it says so (`baseline_cached` False; where
    they were not cached, why); the worker judged it against them as against cached ones."""
    t = result.timings
    if t is None or first is None or first.cached or first.baseline is None:
        return result
    return result.model_copy(update={"timings": t.model_copy(update={
        "baseline_cached": False, "baseline_not_cached": first.note})})


def _with_device_memory(result: VerifyResult, device: DeviceMemory) -> VerifyResult:
    """The device's memory in use during the request (every process, sampled here) added to the
    worker's own memory report."""
    if result.memory is None or device.peak is None:
        return result
    return result.model_copy(update={"memory": result.memory.model_copy(update={
        "device_peak_bytes": device.peak, "device_idle_bytes": device.idle})})


def _judged(problem: Problem, cid: str, evidence: Evidence, **fields: Any) -> VerifyResult:
    """The result of an ending the pool saw (or a failed problem): `judge` decides its verdict and
    summary from the evidence, as it does for the worker's own pipeline."""
    judgement = judge(evidence)
    return VerifyResult(candidate_id=cid, problem=problem.name, problem_hash=problem.hash, verdict=judgement.verdict,
                        summary=judgement.summary, flagged=judgement.flagged, compile=evidence.compile,
                        findings=evidence.findings, **fields)
