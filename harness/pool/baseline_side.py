"""The baselines side of the worker pool (server side): a problem's eager and torch.compile
baselines timed alone, without a candidate, in a verify worker no candidate ran in.

`WorkerPool` (`harness.pool.pool`) is this class plus the verify requests and the census side, on the
worker processes of `harness.pool.workers`. Baselines are timed in a worker that has served no
candidate (the active one while it served none, else the spare, which runs no candidate while it
waits): a candidate's changes to its process (dynamo's or inductor's settings and caches, patched
functions) would otherwise be measured as the reference's figures, and cached for every later
candidate of the problem. A verification whose problem has no cached baselines has them timed first,
that way (`_baselines_first`), and hands them to the worker.
"""

from __future__ import annotations

import time
import uuid

from pydantic import ValidationError

from kb_mcp.harness.baselines import BaselineCache, BaselineRun, not_cached
from kb_mcp.harness.gpu import lane
from kb_mcp.harness.gpu.gpu_memory import DeviceMemory
from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.phases import BASELINE_WORDS, PHASE_WORDS, PHASES, StepClock
from kb_mcp.harness.pool.process import ReplyReader, WorkerProcess, describe_exit
from kb_mcp.harness.pool.workers import Workers
from kb_mcp.harness.problem import Problem
from kb_mcp.harness.protocol import BaselineReply, BaselineRequest, ProblemFailed, VerifyReply
from kb_mcp.harness.sandbox.channel import ChannelClosed, ForgedFrame, new_key
from kb_mcp.kb.progress import Progress, no_progress

__all__ = ["BaselineSide"]


class BaselineSide(Workers):
    """The baselines of a `WorkerPool` (see the module's docstring)."""

    def baselines(self, problem: Problem, options: VerifyOptions | None = None,
                  progress: Progress = no_progress) -> BaselineRun:
        """Times `problem`'s eager and torch.compile baselines alone in a verify worker no candidate
        ran in, caches them like a verification's, and says how it went (`BaselineRun.status`). Never
        raises for the problem's own failures; raises WorkerError when no worker can be started at all."""
        opts = options or VerifyOptions()
        t0 = time.monotonic()
        steps = StepClock()
        with lane.hold(f"baselines of {problem.name}", progress), self._lock:
            steps.mark("lane")
            self._ready()
            self._settle_starts()  # (here, so that a new pool's start-up is counted as such)
            steps.mark("worker_start")
            run = self._baselines_held(problem, opts, progress)
            steps.mark("request")
            self._settle_starts()
            steps.mark("worker_restart")
        return run.model_copy(update={"elapsed_s": round(time.monotonic() - t0, 3),
                                      "phases": steps.nested("request", run.phases)})

    def _baselines_held(self, problem: Problem, opts: VerifyOptions, progress: Progress) -> BaselineRun:
        """The baselines timed (the GPU lane held by the caller) in a worker no candidate ran in, and
        cached where the measurement held the GPU alone; the run's baseline carries the pool's key."""
        w = self._candidate_free()
        info = w.info
        if self.no_cuda or info is None or not info.cuda:
            return BaselineRun(problem=problem.name, problem_hash=problem.hash, status="needs_gpu",
                               note="no CUDA GPU in the worker: baselines are timed on a GPU only")
        # A spare or census worker still starting (a new pool's, or one started just now) would
        # initialise CUDA beside the timed series: wait for it first.
        self._settle_starts()
        with DeviceMemory(info.uuid) as device:
            run = self._baseline_request(w, problem, opts, progress)
        run = run.model_copy(update={"device": info.device, "device_peak_bytes": device.peak,
                                     "device_idle_bytes": device.idle})
        if run.baseline is None:
            return run
        base = run.baseline.model_copy(update={"problem_hash": problem.hash, "device": info.device,
                                               "torch_version": info.torch_version, "track": opts.track.value})
        held = lane.current()
        if held is None or not held.alone:  # measured beside whatever else ran on the GPU: not a baseline to keep
            return run.model_copy(update={"baseline": base,
                                          "note": not_cached(held.why_not if held else "the GPU lane was not held")})
        BaselineCache(self.cache_dir).put(base)
        return run.model_copy(update={"baseline": base})

    def _baselines_first(self, problem: Problem, opts: VerifyOptions, progress: Progress) -> BaselineRun | None:
        """The problem's baselines for a verification (the lane held): the cache's (`cached`), else
        timed now in a worker no candidate ran in (`_candidate_free`), before the candidate; None
        without a GPU worker. A run without a baseline (the problem's failure) leaves the
        verification to name it."""
        info = self._ready().info
        if info is None or not info.cuda:
            return None
        cached = BaselineCache(self.cache_dir).get(problem.hash, info.device, info.torch_version,
                                                   need_compile=opts.compile_baseline, track=opts.track.value)
        if cached is not None:
            return BaselineRun(problem=problem.name, problem_hash=problem.hash, status="ok", baseline=cached,
                               device=info.device, cached=True)
        progress(0, len(PHASES), PHASE_WORDS["reference_baselines"])
        # timed in full even for a quick verdict: the figures are cached for every later one
        return self._baselines_held(problem, opts.model_copy(update={"timing": True}), progress)

    def _baseline_request(self, w: WorkerProcess, problem: Problem, opts: VerifyOptions,
                          progress: Progress) -> BaselineRun:
        rid, key = uuid.uuid4().hex, new_key()
        self._send(w, BaselineRequest(rid=rid, key=key.hex(), problem=problem, options=opts))
        run = BaselineRun(problem=problem.name, problem_hash=problem.hash, status="harness_error")
        limit = max(600.0, opts.timeout_s)
        reply = ReplyReader(w, rid, key, lambda phase: limit, "baselines")
        try:
            frame = reply.read(lambda phase: progress(0, None, BASELINE_WORDS.get(phase, phase)), lambda ask: None)
        except TimeoutError:
            self._retire(w)
            where = BASELINE_WORDS.get(reply.phase, reply.phase)
            return run.model_copy(update={"note": f"no answer within {limit:.0f} s while {where}"})
        except ChannelClosed:
            code = w.proc.wait(timeout=30)
            self._retire(w)
            where = BASELINE_WORDS.get(reply.phase, reply.phase)
            return run.model_copy(update={"note": f"the worker died ({describe_exit(code)}) while {where}"})
        except (ForgedFrame, ValidationError) as exc:
            self._retire(w)
            return run.model_copy(update={"note": f"the worker's answer was malformed ({exc})"})
        body = frame.body
        if frame.retire:
            self._retire(w)
            run = run.model_copy(update={"worker_retired": frame.why_retire or "the problem's run left it unfit"})
        if isinstance(body, ProblemFailed):
            status = "too_large" if body.too_large is not None else "problem_error"
            return run.model_copy(update={"status": status, "note": body.text, "too_large": body.too_large})
        if isinstance(body, VerifyReply):  # the worker's own error, worded as a verdict
            return run.model_copy(update={"note": body.result.summary})
        if not isinstance(body, BaselineReply):
            return run.model_copy(update={"note": f"the worker answered {body.kind!r}"})
        if body.too_large is not None:
            return run.model_copy(update={"status": "too_large", "note": body.too_large.text,
                                          "too_large": body.too_large, "footprint": body.footprint})
        return run.model_copy(update={"status": "ok", "baseline": body.baseline, "footprint": body.footprint,
                                      "peak_bytes": body.peak_bytes, "phases": body.phases})
