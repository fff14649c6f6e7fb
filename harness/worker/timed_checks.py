"""The timed half of a candidate's checks (worker side): its timed series, every output re-checked,
the reference's eager series where eager is timed now, and the roofline bound; torch.compile is
never timed here (`NOT_TIMED_HERE`). `harness.worker.checks.Checker` is this class plus the input
sets and checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kb_mcp.harness.baselines import Baseline
from kb_mcp.harness.gpu.memory import Footprint
from kb_mcp.harness.judgment.verdict import Timings
from kb_mcp.harness.protocol import CensusReply
from kb_mcp.harness.worker.footprint import first_float, nbytes
from kb_mcp.harness.worker.roofline import dram_bandwidth, peak_flops, roofline_ms
from kb_mcp.harness.worker.rounding import RoundingJudge
from kb_mcp.harness.worker.timing import (
    RunStats,
    Series,
    stop_rules,
    time_with_reference,
    timings_against,
)
from kb_mcp.harness.worker.values import clone_inputs, compare, leaves, secret_seed, tolerance_for

__all__ = ["NOT_TIMED_HERE", "TimedChecks"]

NOT_TIMED_HERE = ("torch.compile not timed for this verdict: it is timed only in a worker no candidate ran in, "
                  "before the candidate (`WorkerPool.verify`), and that measurement did not come")


class TimedChecks:
    """The timing part of `Checker` (see the module's docstring)."""

    # Provided by Checker:
    v: Any
    ref: torch.nn.Module
    cand: torch.nn.Module
    atol: float | None
    rtol: float | None
    host_pristine: bool
    footprint: Footprint
    io_bytes: int
    flops: float
    dtype: torch.dtype
    dtypes: set[str]
    make_inputs: Callable[..., list[Any]]
    ref_args: Callable[[list[Any]], list[Any]]
    judge: RoundingJudge

    def _measure(self, xs: list[Any]) -> None:
        """Bytes in and out and FLOPs of the reference, for the roofline bound, measured on the GPU
        where the meta device could not run its forward (`harness.worker.footprint`)."""
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as fc:
            out = self.ref(*(xs if self.host_pristine else clone_inputs(xs)))
        self.flops = float(fc.get_total_flops())
        tensors = [x for x in xs if isinstance(x, torch.Tensor)] + (leaves(out) or [])
        self.io_bytes = nbytes(tensors)
        self.dtype = getattr(torch, first_float(tensors), torch.float32)
        params = [p for p in self.ref.parameters() if p.is_floating_point()]
        self.dtypes = {str(t.dtype).replace("torch.", "") for t in tensors + params if t.is_floating_point()}
        self.footprint = self.v.footprint = self.footprint.model_copy(update={
            "output_bytes": nbytes(leaves(out) or []), "flops": self.flops, "dtypes": sorted(self.dtypes),
            "dtype": str(self.dtype).replace("torch.", "")})

    def _gen(self, with_ref: dict[int, Any] | None, seeds: dict[int, int] | None = None) -> Callable[[int], list[Any]]:
        """Fresh inputs for run i; with `with_ref`, the reference's output on them kept by i (and
        their seed in `seeds`, to make them again for the float64 judgment)."""
        def make(i: int) -> list[Any]:
            seed = secret_seed()
            xs = self.make_inputs(seed)
            if with_ref is not None and i >= 0:
                with_ref[i] = self.ref(*self.ref_args(xs))
                if seeds is not None:
                    seeds[i] = seed
            return xs

        return make

    def time_candidate(self, base: Baseline | None) -> tuple[RunStats, RunStats | None]:
        """The timed series of the candidate, every output re-checked against its reference, and
        the reference's eager series where eager is timed now (`timing.time_with_reference`: a
        first measurement, and a cached launch-bound reference re-timed beside the candidate)."""
        v, timer = self.v, self.v.env.timer
        assert timer is not None
        refs: dict[int, Any] = {}
        seeds: dict[int, int] = {}

        def check(i: int, out: Any) -> str | None:
            return self._timed_output(out, refs.pop(i), seeds.pop(i))

        quick = not v.options.timing
        warm = 1 if quick else v.options.warmup_runs
        runs = timer.runs_for(self.cand, self._named(self._gen(None)), quick, v.options.timed_runs)
        wall, precision = stop_rules(v.options.timed_runs)
        # a cached, GPU-bound baseline is fixed: the series may stop once the verdict against it is known
        turns = base.turns_at(v.options.compile_baseline) if base is not None and not base.launch_bound else None
        cand = Series(self.cand, self._named(self._gen(refs, seeds)), runs, warm, check, wall, precision, turns)
        return time_with_reference(timer, cand, self.ref, self._gen(None), base, quick)

    def _timed_output(self, out: Any, ref_out: Any, seed: int) -> str | None:
        """Why a timed run's output is wrong (None: it is right): the same comparison as the input
        sets', a rounding-sized failure judged against float64 on the run's inputs made again from
        their seed (`rounding.RoundingJudge`)."""
        rl, cl = leaves(ref_out) or [], leaves(out)
        if cl is None or len(cl) != len(rl):
            return "wrong output type"
        comps = []
        for c, rr in zip(cl, rl):
            if type(c) is not torch.Tensor or c.shape != rr.shape or c.dtype != rr.dtype or c.device != rr.device:
                return f"output {type(c).__name__} {tuple(c.shape)} {c.dtype} on {c.device}"
            atol, rtol, _ = tolerance_for(rr.dtype, self.atol, self.rtol, self.v.options)
            comps.append(compare(c, rr, atol, rtol, detail=False))
        failed = next((cm for cm in comps if not cm.passed), None)
        if failed is None:
            return None
        if not self.judge.applies(comps, rl):
            return failed.message
        judged = self.judge.judge(failed.message, cl, rl, lambda: self.make_inputs(seed), release=False)
        return None if judged.passed else judged.message

    def _named(self, make: Callable[[int], list[Any]]) -> Callable[[int], list[Any]]:
        """`make`, telling `fault.Blame` which call of the candidate comes next (outside the timed region)."""
        blame = self.v.blame

        def named(i: int) -> list[Any]:
            xs = make(i)
            blame.calling(f"ModelNew.forward (timed run {i})" if i >= 0 else "ModelNew.forward (a warm-up run)")
            return xs

        return named

    def timings(self, stats: RunStats, eager: RunStats | None, base: Baseline | None,
                census: CensusReply | None = None) -> Timings:
        """Candidate timings against eager and torch.compile (`timing.timings_against`) and the
        roofline bound. Without a baseline from the pool, `eager` (timed in this verdict) is the eager
        figure (cached where torch.compile is not wanted; not for quick runs). Beside
        them the device times the census worker measured (`census`): the candidate's, and eager's
        (measured there now, else the cached baseline's)."""
        v = self.v
        env = v.env
        quick = not v.options.timing
        want_compile = v.options.compile_baseline
        cached = base is not None
        if base is None:
            assert eager is not None
            # torch.compile is never timed here, after the candidate ran in this process: whatever the
            # candidate did to dynamo or inductor (their config, caches, code) would be measured as
            # torch.compile's figure and cached for every later candidate of the problem. The pool
            # times both baselines first, in a worker no candidate ran in (`WorkerPool.verify`); only
            # where that failed does a verdict get here without them.
            compile_note = NOT_TIMED_HERE if want_compile else ""
            base = Baseline(problem_hash=v.problem.hash, device=env.device, torch_version=env.torch_version,
                            eager_ms=eager.median_ms, eager_runs=len(eager.gpu_ms),
                            eager_issue_ms=eager.issue_median_ms, compile_note=compile_note,
                            eager_device_ms=census.reference_device.ms if census and census.reference_device else None)
            if not quick and not want_compile:
                v.new_baseline = base  # the server keeps it: this process may not write the shared cache
        bw = dram_bandwidth(env.props)
        bound = roofline_ms(self.io_bytes, self.flops, bw, peak_flops(env.device, self.dtype))
        return timings_against(stats, eager, base, cached, want_compile=want_compile, quick=quick, bound_ms=bound,
                               device=census.device if census is not None else None,
                               eager_device=census.reference_device if census is not None else None)

