"""The census side of the worker pool (server side): the answers the pool gives a verify worker that
asks for a kernel census or a work census mid-request, and the census on its own.

`WorkerPool` (`harness.pool.pool`) is this class plus the verify requests and the baselines side, on
the worker processes of `harness.pool.workers`; the census worker runs one
forward under the profiler in a process of its own (`harness.worker.census`), so that the verify
worker's timings are those of a process that never profiled.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from kb_mcp.harness.attempt_findings import census_with_attempts
from kb_mcp.harness.baselines import Baseline, BaselineCache, ReferenceOps, ReferenceOpsCache
from kb_mcp.harness.builds.builds import BuildService
from kb_mcp.harness.builds.compile_only import CompileOnly
from kb_mcp.harness.gpu import lane
from kb_mcp.harness.judgment.composed import COMPOSED
from kb_mcp.harness.judgment.verdict import Failure, FailureKind, Finding, FindingCode, VerifyOptions
from kb_mcp.harness.phases import CENSUS_WORDS
from kb_mcp.harness.pool.process import ReplyReader, WorkerError, WorkerProcess, describe_exit, following
from kb_mcp.harness.pool.workers import Workers
from kb_mcp.harness.problem import Problem, candidate_id
from kb_mcp.harness.protocol import BuildAsk, CensusAnswer, CensusReply, CensusRequest, ProblemFailed
from kb_mcp.harness.sandbox.attempts import collecting
from kb_mcp.harness.sandbox.channel import POOL_KEY, ChannelClosed, ForgedFrame, new_key, send
from kb_mcp.profiling.work import take_work_census

__all__ = ["CensusSide"]


class CensusSide(Workers):
    """The census answers of a `WorkerPool`, taken in its census worker (see the module's docstring)."""

    # Provided by WorkerPool:
    builds: BuildService
    compile_only: CompileOnly
    _reference_device_unknown: set[tuple[str, str]]
    _answer_build: Callable[[WorkerProcess, str, BuildAsk, float], None]

    def census(self, problem: Problem, source: str, options: VerifyOptions | None = None,
               reference_device: bool = False) -> CensusReply:
        """The kernel census of one forward of `source` and its device time (with `reference_device`,
        the reference's too), in the census worker; for callers that want the census alone (`verify`
        takes it between the checks and the timing). Never raises for a misbehaving candidate or
        problem (the reply says what happened); raises WorkerError when no census worker starts."""
        opts = options or VerifyOptions()
        with collecting() as seen, lane.hold(f"census {problem.name}"), self._lock, following(seen, self._census):
            reply = self._take_census(problem, source, opts, candidate_id(problem, source), reference_device)
        if isinstance(reply, ProblemFailed):
            return CensusReply(failure=Failure(kind=FailureKind.census_problem_failed, detail=reply.text))
        return census_with_attempts(reply, seen)

    def _census_limit(self, phase: str, opts: VerifyOptions) -> float:
        return opts.compile_timeout_s if phase in ("queued", "import", "construct") else opts.timeout_s

    def _take_census(self, problem: Problem, source: str, opts: VerifyOptions, cid: str,
                     reference_device: bool = False, reference_ops: bool = False) -> CensusReply | ProblemFailed:
        t0 = time.monotonic()
        rid = uuid.uuid4().hex
        key = new_key()
        request = CensusRequest(rid=rid, key=key.hex(), problem=problem, source=source, options=opts, candidate_id=cid,
                                reference_device=reference_device, reference_ops=reference_ops)
        for attempt in range(2):
            # the reference's device time and op set, cached for later candidates, are taken where none has run
            w = self._census_worker(untouched=reference_device or reference_ops)
            w.output.reset()
            try:
                send(w.sock, request, POOL_KEY)
                w.served += 1
                break
            except OSError:  # it died while idle (killed from outside): a fresh one takes the request
                if attempt:
                    raise WorkerError("the census worker does not take requests") from None
                self._replace_census(w)
        exchange = ReplyReader(w, rid, key, lambda phase: self._census_limit(phase, opts), "census")

        def on_ask(ask: Any) -> None:
            if not isinstance(ask, BuildAsk):
                raise ForgedFrame("the census worker asked for a census")
            self._answer_build(w, rid, ask, opts.compile_timeout_s)

        try:
            frame = exchange.read(lambda phase: None, on_ask)
            if not isinstance(frame.body, (CensusReply, ProblemFailed)):
                raise ForgedFrame(f"a {frame.body.kind!r} result arrived for a census request")
            reply, retire = frame.body, frame.retire
        except TimeoutError:
            phase = exchange.phase
            self._replace_census(w)
            return CensusReply(elapsed_s=round(time.monotonic() - t0, 3), failure=Failure(
                kind=FailureKind.census_timed_out, where=CENSUS_WORDS.get(phase, phase),
                limit_s=self._census_limit(phase, opts)))
        except ChannelClosed:
            phase = exchange.phase
            code = w.proc.wait(timeout=30)
            self._replace_census(w)
            return CensusReply(elapsed_s=round(time.monotonic() - t0, 3), failure=Failure(
                kind=FailureKind.census_died, where=CENSUS_WORDS.get(phase, phase), detail=describe_exit(code)))
        except (ForgedFrame, ValidationError) as exc:
            self._replace_census(w)
            finding = Finding(
                code=FindingCode.forged_result, source="runtime",
                message=(f"the census worker's channel carried data the harness did not send ({exc}); writing "
                         "to the harness's channels or faking its messages is not allowed"),
            )
            return CensusReply(findings=[finding], failure=Failure(kind=FailureKind.forged_frame),
                               elapsed_s=round(time.monotonic() - t0, 3))
        if retire:
            self._replace_census(w)
        if isinstance(reply, ProblemFailed):
            return reply
        if reference_device and reply.clean and (reply.reference_device is None or reply.reference_device.ms is None):
            self._reference_device_unknown.add((problem.hash, opts.track.value))
        return reply.model_copy(update={"elapsed_s": round(time.monotonic() - t0, 3)})

    def _answer_census(self, w: WorkerProcess, rid: str, problem: Problem, source: str, opts: VerifyOptions,
                       cid: str, units: list[Any]) -> None:
        """Takes the census for the verify worker `w` (waiting on request `rid`) and answers it,
        once nothing else of the pool is starting up (the verify worker times right after), with
        what the SASS of the candidate's builds `units` computes in (`CompileOnly.precision_of`).
        The reference's device time is measured there too where wanted (`reference_device_wanted`),
        and added to the cached baseline (`BaselineCache.add_reference_device`)."""
        info, cache = w.info, BaselineCache(self.cache_dir)
        cached, wanted, kept, want_ops = self._reference_wants(w, problem, opts)
        try:
            reply = self._take_census(problem, source, opts, cid, reference_device=wanted, reference_ops=want_ops)
        except WorkerError:
            self._replace(w)  # it waits for an answer that will not come
            raise
        if isinstance(reply, ProblemFailed):  # it loaded in the verify worker: not deterministic
            reply = CensusReply(failure=Failure(kind=FailureKind.census_problem_diverged, detail=reply.text))
        if reply.clean:
            # measured where no candidate had run (`_take_census`), and the census came back clean
            cache.add_reference_device(cached, reply.reference_device.ms if reply.reference_device else None)
            if want_ops and reply.reference_ops is not None and info is not None:
                ReferenceOpsCache(self.cache_dir).add(problem.hash, info.device, info.torch_version, opts.track.value,
                                                      kernels=reply.reference_ops)
            self._settle_starts()
        if not want_ops and kept is not None:  # composed mode: the verify worker compares with the cached set
            reply = reply.model_copy(update={"reference_ops": kept.kernels})
        if reply.failure is None and units:
            arch = w.info.arch if w.info else ""
            reply = reply.model_copy(update={"precision": self.compile_only.precision_of(
                units, arch, self.builds, opts.compile_timeout_s)})
        try:
            send(w.sock, CensusAnswer(rid=rid, reply=reply), POOL_KEY)
        except OSError:
            pass  # the verify worker is gone: the next read says how

    def _reference_wants(self, w: WorkerProcess, problem: Problem, opts: VerifyOptions,
                         ) -> tuple[Baseline | None, bool, ReferenceOps | None, bool]:
        """What a census for `w`'s verification of `problem` takes of the reference besides the
        candidate: (the cached baseline, whether its device time is measured, the cached op set of
        composed mode, whether that op set is taken). Either measurement needs a census worker no
        candidate has run in."""
        info = w.info
        cached = None if info is None else BaselineCache(self.cache_dir).get(
            problem.hash, info.device, info.torch_version, need_compile=False, track=opts.track.value)
        wanted = self.reference_device_wanted(problem, opts, cached)
        kept = None if info is None or opts.mode != COMPOSED else ReferenceOpsCache(self.cache_dir).get(
            problem.hash, info.device, info.torch_version, opts.track.value)
        want_ops = opts.mode == COMPOSED and (kept is None or kept.kernels is None)
        return cached, wanted, kept, want_ops

    def _census_ahead(self, w: WorkerProcess, problem: Problem, opts: VerifyOptions) -> None:
        """Starts a census worker no candidate has run in now, while `w` runs the checks, where the
        census of this verification will want one (`_reference_wants`: a problem's first verdicts)
        and the one there has served a candidate. Started at the census, its start (torch, CUDA, the
        profiler's first session) was most of a first verdict's census phase; here it overlaps the
        checks, which measure nothing, and it is ready before anything is timed (`_census_worker`
        waits for it, `_settle_starts` before every timed series)."""
        current = self._census
        if current is None or not current.served:
            return
        _, wanted, _, want_ops = self._reference_wants(w, problem, opts)
        if wanted or want_ops:
            self._drop(current)
            self._census = self._new("census")

    def reference_device_wanted(self, problem: Problem, opts: VerifyOptions, cached: Baseline | None) -> bool:
        """Whether a verification's census measures the reference's device time: the cached baseline
        lacks it and no clean census of this pool found it unknown (where the profiler sees no device
        durations, asking at every verification would restart the census worker)."""
        if cached is not None and cached.eager_device_ms is not None:
            return False
        return (problem.hash, opts.track.value) not in self._reference_device_unknown

    def _answer_work(self, w: WorkerProcess, rid: str, problem: Problem, source: str, opts: VerifyOptions) -> None:
        """Takes the work census (`profiling.work`: hardware counters of one forward, under ncu in
        the sandbox) for the verify worker `w` and answers it; an unavailable one says why."""
        census = take_work_census(problem, source, cache_dir=self.cache_dir, sandbox=self.sandbox,
                                  timeout_s=opts.timeout_s)
        self._settle_starts()
        try:
            send(w.sock, CensusAnswer(rid=rid, reply=CensusReply(work=census)), POOL_KEY)
        except OSError:
            pass  # the verify worker is gone: the next read says how
