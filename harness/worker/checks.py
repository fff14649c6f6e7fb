"""The input sets and checks of one candidate against its reference, and its timed series (worker side).

For each set the reference runs first on a clone of the inputs and its output stays alive; the
caching allocator is filled with poison (0xFF bytes: NaN for floats) in blocks of the output's
size; the candidate runs under the integrity guard on its own clone; then output type, shape,
dtype and device are checked exactly, inputs must be unchanged, the output must not share memory
with the reference's, values must be finite and within tolerance. One set is re-run (a second run
must agree) and one with new values written into the previous set's input buffers (results cached
on pointers or shapes fail there). Then the patterns: public-only passes (`seed_prediction`),
shifted-only failures (`distribution_shortcut`), small errors everywhere (`precision_lowered`),
parameters perturbed in both models (`ignores_inputs`).

A problem may define `get_shifted_inputs()` for the different-distribution set; otherwise two sets
vary the floating inputs of fresh sets (`harness.worker.distributions`: signs mixed per element with
zeros, values around activation knees and magnitudes 1/8-8x; every input negated and stretched),
each with a gentler fallback where the reference is not finite, and skipped (saying so) where the
fallback is not finite either.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kb_mcp.harness.baselines import Baseline
from kb_mcp.harness.protocol import CensusReply
from kb_mcp.harness.verdict import Failure, FailureKind, Finding, FindingCode, InputSetCheck, Timings
from kb_mcp.harness.worker.distributions import SETS, Variant, vary
from kb_mcp.harness.worker.fault import Halted, ProblemBroken, first_line, is_cuda_error, is_out_of_memory
from kb_mcp.harness.worker.integrity import IntegrityGuard
from kb_mcp.harness.worker.perturb import ParamMapping, map_parameters, parameter_infos, perturb
from kb_mcp.harness.worker.timing import (
    QUICK_RUNS,
    RunStats,
    Series,
    dram_bandwidth,
    peak_flops,
    roofline_ms,
    time_with_reference,
    timings_against,
)
from kb_mcp.harness.worker.values import (
    LOWERED_PRECISION_ERR,
    MAX_PERTURBED_INPUTS,
    PUBLIC_SEED,
    clone_inputs,
    compare,
    largest,
    leaves,
    overlaps,
    poison_allocator,
    same,
    secret_seed,
    tolerance_for,
)


class Checker:
    """Input sets, checks and timing of one candidate against its reference."""

    def __init__(self, v: Any, pmod: Any, ref: torch.nn.Module, cand: torch.nn.Module,
                 guard: IntegrityGuard) -> None:
        """`v` is the `verify.GpuVerification` this checker records into (its options, findings,
        sets, tolerance and the baseline it measures)."""
        self.v = v
        self.pmod = pmod
        self.ref = ref
        self.cand = cand
        self.guard = guard
        self.atol = getattr(pmod, "ATOL", None)
        self.rtol = getattr(pmod, "RTOL", None)
        self.sync = guard.trusted.synchronize
        self.alive: list[Any] = []  # reference outputs stay alive while the candidate runs
        self.io_bytes = 0
        self.flops = 0.0
        self.dtype: torch.dtype = torch.float32
        self.dtypes: set[str] = set()  # the problem's floating dtypes (inputs, outputs, parameters)
        self.lowered: list[int] = []  # failed sets whose errors look like a lower precision
        self.mapping: ParamMapping | None = None  # Model's parameters to ModelNew's (`perturb.map_parameters`)
        self.ref_params: dict[str, torch.nn.Parameter] = {}
        self.cand_params: dict[str, torch.nn.Parameter] = {}

    # -- inputs -----------------------------------------------------------------------------

    def make_inputs(self, seed: int, shifted: bool = False) -> list[Any]:
        """A fresh input set from `seed`, made on the GPU."""
        torch.manual_seed(seed)
        with torch.device("cuda"):
            if shifted and callable(getattr(self.pmod, "get_shifted_inputs", None)):
                xs = list(self.pmod.get_shifted_inputs())
            else:
                xs = list(self.pmod.get_inputs())
                if shifted:
                    xs = self._shift(xs, seed)
        xs = [x.cuda() if isinstance(x, torch.Tensor) and not x.is_cuda else x for x in xs]
        torch.manual_seed(secret_seed())  # the candidate cannot read back the seed of this set
        return xs

    @staticmethod
    def _shift(xs: list[Any], seed: int) -> list[Any]:
        """`xs` of a different distribution: the first variant of `distributions.SETS`."""
        return vary(xs, seed, SETS[0][0])

    # -- runs -------------------------------------------------------------------------------

    def ref_run(self, xs: list[Any]) -> Any:
        """The reference output for `xs` (on a clone), kept alive."""
        out = self.ref(*clone_inputs(xs))
        self.alive.append(out)
        return out

    def cand_run(self, args: list[Any], ref_out: Any, watch: bool = True) -> Any:
        """One candidate call on `args` with the allocator poisoned in blocks the output's size. What
        the call raises, or leaves for the synchronize to report, is the candidate's (`fault.Blame`)."""
        ls = leaves(ref_out) or []
        poison_allocator([t.untyped_storage().nbytes() for t in ls] * 2)
        self.sync()
        blame = self.v.blame
        blame.checked_call()
        try:
            if watch:
                with self.guard.watch():
                    out = self.cand(*args)
            else:
                out = self.cand(*args)
            self.sync()
        except BaseException as exc:  # candidate code may raise anything
            if is_out_of_memory(exc):
                raise  # weighed in the stage loop, once the sets the checks hold are let go (`fault.Blame`)
            raise blame.inside(exc, blame.last) from None
        return out

    # -- checks -----------------------------------------------------------------------------

    def check(self, index: int, kind: str, ref_out: Any, out: Any, args: list[Any] | None = None,
              pristine: list[Any] | None = None, ref_inputs: list[Any] | None = None) -> InputSetCheck:
        """Compares one output with the reference and records findings; returns the set's result."""
        v = self.v
        r_leaves = leaves(ref_out)
        c_leaves = leaves(out)
        if r_leaves is None:
            raise Halted(Failure(kind=FailureKind.problem_output,
                                 detail="the problem's Model returns something other than tensors"))
        if c_leaves is None or len(c_leaves) != len(r_leaves):
            msg = (f"forward returned {type(out).__name__}, expected "
                   f"{'a tensor' if isinstance(ref_out, torch.Tensor) else f'{len(r_leaves)} tensors'}")
            v.findings.append(Finding(code=FindingCode.wrong_output_type, message=msg))
            return self._record(InputSetCheck(index=index, kind=kind, passed=False, message=msg))
        problems: list[str] = []
        for c, r in zip(c_leaves, r_leaves):
            if type(c) is not torch.Tensor:
                problems.append(f"output is a {type(c).__module__}.{type(c).__qualname__}, not a plain torch.Tensor")
            elif c.shape != r.shape or c.dtype != r.dtype or c.device != r.device:
                problems.append(f"output is {tuple(c.shape)} {c.dtype} on {c.device}, expected "
                                f"{tuple(r.shape)} {r.dtype} on {r.device}")
        if problems:
            v.findings.append(Finding(code=FindingCode.wrong_output_type,
                                      message=problems[0] + "; return exactly what Model returns"))
            return self._record(InputSetCheck(index=index, kind=kind, passed=False, message=problems[0]))
        theirs = list(r_leaves + [x for x in (ref_inputs or []) if isinstance(x, torch.Tensor)])
        if any(overlaps(c, theirs) for c in c_leaves):
            v.findings.append(Finding(
                code=FindingCode.reused_reference_output,
                message="the output shares memory with the reference's output or inputs; compute into memory of "
                        "your own",
            ))
        if args is not None and pristine is not None:
            for i, (a, p) in enumerate(zip(args, pristine)):
                if isinstance(a, torch.Tensor) and not same(a, p):
                    v.findings.append(Finding(
                        code=FindingCode.input_mutated,
                        message=f"forward wrote into input {i}; inputs are read-only (write results to new tensors)",
                    ))
        comps = []
        for c, r in zip(c_leaves, r_leaves):
            atol, rtol, note = tolerance_for(r.dtype, self.atol, self.rtol, v.options)
            if not v.tolerance:
                v.tolerance = {"atol": atol, "rtol": rtol}
            if note:
                v.loosened = note
            comps.append(compare(c, r, atol, rtol))
        if any(cm.poison for cm in comps):
            n = sum(cm.poison for cm in comps)
            v.findings.append(Finding(
                code=FindingCode.uninitialized_output,
                message=(f"{n} output elements still hold the poison the harness wrote into freed memory: they were "
                         "never written (the kernel does not cover the whole output)"),
            ))
        if any(cm.constant for cm in comps):
            v.findings.append(Finding(
                code=FindingCode.constant_output,
                message="the output is one constant value where the reference's varies",
            ))
        passed = all(cm.passed for cm in comps)
        first_bad = next((cm for cm in comps if not cm.passed), None)
        if not passed and all(
            cm.passed or (r.dtype in (torch.float32, torch.float64) and not cm.nonfinite and not cm.poison
                          and cm.scaled is not None and cm.scaled <= LOWERED_PRECISION_ERR)
            for cm, r in zip(comps, r_leaves)
        ):
            self.lowered.append(index)
        return self._record(InputSetCheck(
            index=index, kind=kind, passed=passed,
            max_abs_err=largest(cm.max_abs for cm in comps), max_rel_err=largest(cm.max_rel for cm in comps),
            scaled_err=largest(cm.scaled for cm in comps), mismatched=sum(cm.mismatched for cm in comps),
            numel=sum(cm.numel for cm in comps), message=first_bad.message if first_bad else "",
        ))

    def _record(self, check: InputSetCheck) -> InputSetCheck:
        self.v.sets.append(check)
        return check

    def one_set(self, index: int, kind: str, xs: list[Any]) -> tuple[InputSetCheck, Any, Any, list[Any]]:
        """Reference, then candidate on a clone, then the check. Returns (check, ref_out, out, args)."""
        ref_out = self.ref_run(xs)
        args = clone_inputs(xs)
        out = self.cand_run(args, ref_out)
        return self.check(index, kind, ref_out, out, args, xs, xs), ref_out, out, args

    def run_sets(self) -> None:
        """Every input set and the derived checks (caching, repeat, census, shortcuts)."""
        v = self.v
        opts = v.options
        index = itertools.count()
        public_xs = self.make_inputs(PUBLIC_SEED)
        self._measure(public_xs)
        public, public_ref, public_out, public_args = self.one_set(next(index), "public_seed", public_xs)
        secret: list[tuple[InputSetCheck, list[Any], Any, Any, list[Any]]] = []
        for k in range(opts.input_sets):
            xs = self.make_inputs(secret_seed())
            chk, ref_out, out, args = self.one_set(next(index), "secret", xs)
            secret.append((chk, xs, ref_out, out, args))
            if k == 1:
                self._reused_buffers(next(index), secret[0], secret[1])
        for s in opts.seeds:
            self.one_set(next(index), "user_seed", self.make_inputs(int(s)))
        self._shifted(index)
        # The first (public) set again: does it still agree?
        repeat = self._repeat(next(index), (public, public_xs, public_ref, public_out, public_args))
        # What the pattern of failures says.
        secret_failed = [c for c, *_ in secret if not c.passed]
        if public.passed and repeat.passed and secret_failed and len(secret_failed) == len(secret):
            v.findings.append(Finding(
                code=FindingCode.seed_prediction,
                message=(f"correct on the public seed {PUBLIC_SEED} (twice) but wrong on every secret-seed input set: "
                         "the output must come from the inputs, not from predicted ones"),
            ))
        explained = {FindingCode.uninitialized_output, FindingCode.constant_output}
        if secret_failed and not any(f.code in explained for f in v.findings):
            self._ignored_inputs(secret)
        self._perturbed(index)
        failed = [c for c in v.sets if not c.passed]
        if failed and len(self.lowered) == len(failed):
            worst = max(c.scaled_err or 0.0 for c in failed)
            v.findings.append(Finding(
                code=FindingCode.precision_lowered,
                message=(f"errors up to {worst:.2g} of the output's RMS on {len(failed)} input sets: small, but beyond "
                         f"the {str(self.dtype).replace('torch.', '')} tolerance, as computing in a lower precision "
                         "(TF32, "
                         "bf16, fp16) gives; compute and accumulate in the reference's precision (or fix a small "
                         "arithmetic error)"),
            ))

    def _reused_buffers(self, index: int, first: tuple, second: tuple) -> None:
        """Set 2's values written into set 1's input buffers (same pointers, shapes): must give set 2's output."""
        _, _, _, out1, args1 = first
        _, xs2, ref2, _, _ = second
        for a, x in zip(args1, xs2):
            if isinstance(a, torch.Tensor) and isinstance(x, torch.Tensor) and a.shape == x.shape:
                a.copy_(x)
        out = self.cand_run(args1, ref2)
        chk = self.check(index, "reused_buffers", ref2, out)
        if not chk.passed and first[0].passed and second[0].passed:
            stale = leaves(out1) or []
            same_as_before = all(same(a, b) for a, b in zip(leaves(out) or [], stale)) if stale else False
            self.v.findings.append(Finding(
                code=FindingCode.result_caching,
                message=("given new values in the same input buffers, forward returned "
                         + ("its previous result" if same_as_before else "a wrong result")
                         + ": results must not be cached on pointers, shapes or earlier calls"),
            ))

    def _shifted(self, index: Iterator[int]) -> None:
        """The sets of a different distribution: the problem's own `get_shifted_inputs()` where it
        defines one, else `distributions.SETS` (signs, zeros, knees, magnitudes), each variant tried
        in turn until the reference is finite on it. Wrong only there is `distribution_shortcut`,
        naming what differed."""
        if callable(getattr(self.pmod, "get_shifted_inputs", None)):
            self._one_shifted(next(index), [None])
            return
        for variants in SETS:
            self._one_shifted(next(index), list(variants))

    def _one_shifted(self, index: int, variants: list[Variant | None]) -> None:
        """One different-distribution set: the first of `variants` (None: the problem's own) on
        which the reference is finite, or a skipped check saying why none was used."""
        why: list[str] = []
        for variant in variants:
            seed = secret_seed()
            xs = (self.make_inputs(seed, shifted=True) if variant is None
                  else vary(self.make_inputs(seed), seed, variant))
            name = "the problem's get_shifted_inputs()" if variant is None else variant.name
            ref_out, refused = self._reference_on(xs, name, problems_own=variant is None)
            if ref_out is not None:
                break
            why.append(f"{refused} on inputs with {name}")
        else:
            self._record(InputSetCheck(index=index, kind="shifted", passed=True, skipped=True,
                                       message="; ".join(why)))
            return
        self.alive.append(ref_out)
        args = clone_inputs(xs)
        out = self.cand_run(args, ref_out)
        chk = self.check(index, "shifted", ref_out, out, args, xs, xs)
        chk.message = f"{name}: {chk.message}" if chk.message else name
        others = [s for s in self.v.sets if s.kind in ("public_seed", "secret")]
        if not chk.passed and all(s.passed for s in others):
            self.v.findings.append(Finding(
                code=FindingCode.distribution_shortcut,
                message=(f"correct on the usual input distribution but wrong on inputs with {chk.message}; the "
                         "kernel must be correct for any valid input"),
            ))

    def _reference_on(self, xs: list[Any], name: str, problems_own: bool) -> tuple[Any, str]:
        """The reference's output on a different-distribution set, or None and why it cannot be used
        (it raised, or it is not finite there). A CUDA error there ends the run (the context may be
        spoiled), and is not the candidate's: the problem's Model rejects the harness's inputs, or
        fails on its own `get_shifted_inputs()`."""
        try:
            ref_out = self.ref(*clone_inputs(xs))
            finite = all(bool(torch.isfinite(t).all().item()) for t in leaves(ref_out) or [] if t.is_floating_point())
        except Exception as exc:  # the problem's Model may refuse values it was never given
            if is_out_of_memory(exc):
                raise  # whose fault it is, `fault.Blame` decides
            if problems_own and is_cuda_error(exc):
                raise ProblemBroken("reference", exc, (str(getattr(self.pmod, "__file__", "")),)) from exc
            if not is_cuda_error(exc):
                return None, f"the reference raised {type(exc).__name__}"
            raise Halted(Failure(kind=FailureKind.shifted_inputs_rejected, where=f"inputs with {name}",
                                 detail=first_line(exc)), retire=True) from None
        return (ref_out, "") if finite else (None, "the reference is not finite")

    def _repeat(self, index: int, first: tuple) -> InputSetCheck:
        """A set again: does a second run on the same inputs agree with the first?"""
        chk1, xs, ref_out, _out1, _ = first
        args = clone_inputs(xs)
        out = self.cand_run(args, ref_out)
        chk = self.check(index, "repeat", ref_out, out, args, xs, xs)
        if chk1.passed and not chk.passed:
            self.v.findings.append(Finding(
                code=FindingCode.stateful_forward,
                message=(f"a later call on the same inputs as the first is wrong ({chk.message}); forward must "
                         "not depend on earlier calls"),
            ))
        return chk

    def _perturbed(self, index: Iterator[int]) -> None:
        """Parameters of Model and their copies in ModelNew (matched by structure: `perturb`) get the
        same new random values; a candidate that does not read them (e.g. LayerNorm's weight 1 and
        bias 0 left out, or a derived copy made in __init__) fails here. What cannot be matched, or
        a reference that is not finite at the new values, is recorded as a check that did not run."""
        v = self.v
        if self.mapping is None:
            ref_infos, self.ref_params = parameter_infos(self.ref)
            cand_infos, self.cand_params = parameter_infos(self.cand)
            self.mapping = map_parameters(ref_infos, cand_infos)
            if self.mapping.unmatched:
                self._record(InputSetCheck(index=next(index), kind="perturbed", passed=True, skipped=True,
                                           message=self.mapping.note()))
        mapping = self.mapping
        if not mapping.groups:
            return
        perturb(mapping, self.ref_params, self.cand_params, secret_seed())
        xs = self.make_inputs(secret_seed())
        ref_out = self.ref(*clone_inputs(xs))
        if not all(bool(torch.isfinite(t).all().item()) for t in leaves(ref_out) or [] if t.is_floating_point()):
            self._record(InputSetCheck(index=next(index), kind="perturbed", passed=True, skipped=True,
                                       message="the reference is not finite with perturbed parameters"))
            return
        self.alive.append(ref_out)
        args = clone_inputs(xs)
        out = self.cand_run(args, ref_out)
        chk = self.check(next(index), "perturbed", ref_out, out, args, xs, xs)
        others = [s for s in v.sets if s.kind != "perturbed"]
        if not chk.passed and all(s.passed for s in others):
            shared = [n for group in mapping.groups for n in group.ref]
            names = ", ".join(shared[:6]) + (" ..." if len(shared) > 6 else "")
            v.findings.append(Finding(
                code=FindingCode.ignores_inputs,
                message=(f"with new values of the parameters {names} (the same in Model and ModelNew) the output is "
                         f"wrong ({chk.message}): ModelNew does not read them. Read parameters in forward (derived "
                         "copies made in __init__ go stale when parameters change)"),
            ))

    def _ignored_inputs(self, secret: list[tuple]) -> None:
        """On a failure: is some input ignored? Swap one input at a time and see if the output moves."""
        if len(secret) < 2:
            return
        _, xs_a, ref_a, out_a, _ = secret[0]
        _, xs_b, _, _, _ = secret[1]
        tensor_idx = [i for i, x in enumerate(xs_a) if isinstance(x, torch.Tensor)][:MAX_PERTURBED_INPUTS]
        for i in tensor_idx:
            if xs_a[i].shape != xs_b[i].shape:
                continue
            mixed = list(xs_a)
            mixed[i] = xs_b[i]
            ref_m = self.ref(*clone_inputs(mixed))
            out_m = self.cand_run(clone_inputs(mixed), ref_m, watch=False)
            ref_moved = not all(same(a, b) for a, b in zip(leaves(ref_m) or [], leaves(ref_a) or []))
            cand_still = all(same(a, b) for a, b in zip(leaves(out_m) or [], leaves(out_a) or []))
            if ref_moved and cand_still:
                self.v.findings.append(Finding(
                    code=FindingCode.ignores_inputs,
                    message=f"the output does not change when input {i} changes (the reference's does): input {i} is "
                            "ignored",
                ))

    # -- timing -----------------------------------------------------------------------------

    def _measure(self, xs: list[Any]) -> None:
        """Bytes in and out and FLOPs of the reference, for the roofline bound."""
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as fc:
            out = self.ref(*clone_inputs(xs))
        self.flops = float(fc.get_total_flops())
        tensors = [x for x in xs if isinstance(x, torch.Tensor)] + (leaves(out) or [])
        self.io_bytes = sum(t.numel() * t.element_size() for t in tensors)
        floats = [t for t in tensors if t.is_floating_point()]
        if floats:
            self.dtype = floats[0].dtype
        params = [p for p in self.ref.parameters() if p.is_floating_point()]
        self.dtypes = {str(t.dtype).replace("torch.", "") for t in floats + params}

    def _gen(self, with_ref: dict[int, Any] | None) -> Callable[[int], list[Any]]:
        def make(i: int) -> list[Any]:
            xs = self.make_inputs(secret_seed())
            if with_ref is not None and i >= 0:
                with_ref[i] = self.ref(*clone_inputs(xs))
            return xs

        return make

    def time_candidate(self, base: Baseline | None) -> tuple[RunStats, RunStats | None]:
        """The timed series of the candidate, every output re-checked against its reference, and
        the reference's eager series where eager is timed now (`timing.time_with_reference`: a
        first measurement, and a cached launch-bound reference re-timed beside the candidate)."""
        v, timer = self.v, self.v.env.timer
        assert timer is not None
        refs: dict[int, Any] = {}

        def check(i: int, out: Any) -> str | None:
            r = refs.pop(i)
            rl, cl = leaves(r) or [], leaves(out)
            if cl is None or len(cl) != len(rl):
                return "wrong output type"
            for c, rr in zip(cl, rl):
                if type(c) is not torch.Tensor or c.shape != rr.shape or c.dtype != rr.dtype or c.device != rr.device:
                    return f"output {type(c).__name__} {tuple(c.shape)} {c.dtype} on {c.device}"
                atol, rtol, _ = tolerance_for(rr.dtype, self.atol, self.rtol, v.options)
                cm = compare(c, rr, atol, rtol, detail=False)
                if not cm.passed:
                    return cm.message
            return None

        quick = not v.options.timing
        warm = 1 if quick else v.options.warmup_runs
        runs = timer.runs_for(self.cand, self._named(self._gen(None)), quick, v.options.timed_runs)
        cand = Series(self.cand, self._named(self._gen(refs)), runs, warm, check)
        return time_with_reference(timer, cand, self.ref, self._gen(None), base, quick)

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
        roofline bound. Without a cached baseline, `eager` (timed in this verdict) is the new eager
        figure; torch.compile is measured here, and both are cached (not for quick runs). Beside
        them the device times the census worker measured (`census`): the candidate's, and eager's
        (measured there now, else the cached baseline's)."""
        v = self.v
        env = v.env
        timer = env.timer
        assert timer is not None
        quick = not v.options.timing
        want_compile = v.options.compile_baseline
        cached = base is not None
        if base is None:
            assert eager is not None
            compile_ms: float | None = None
            compile_runs = 0
            compile_note = ""
            if want_compile:
                make = self._gen(None)
                try:
                    compiled = torch.compile(self.ref)
                    cruns = QUICK_RUNS if quick else timer.runs_for(compiled, make, False, None)
                    cstats = timer.series(compiled, make, cruns, 1 if quick else v.options.warmup_runs)
                    compile_ms, compile_runs = cstats.median_ms, len(cstats.gpu_ms)
                except Exception as exc:  # torch.compile cannot handle every model
                    if is_cuda_error(exc) or is_out_of_memory(exc):
                        raise  # not torch.compile's limit: whose fault it is, `fault.Blame` decides
                    compile_note = f"torch.compile failed: {type(exc).__name__}: {str(exc)[:300]}"
            base = Baseline(problem_hash=v.problem.hash, device=env.device, torch_version=env.torch_version,
                            eager_ms=eager.median_ms, eager_runs=len(eager.gpu_ms),
                            eager_issue_ms=eager.issue_median_ms, compile_ms=compile_ms,
                            compile_runs=compile_runs, compile_note=compile_note,
                            eager_device_ms=census.reference_device.ms if census and census.reference_device else None)
            if not quick:
                v.new_baseline = base  # the server keeps it: this process may not write the shared cache
        bw = dram_bandwidth(env.props)
        bound = roofline_ms(self.io_bytes, self.flops, bw, peak_flops(env.device, self.dtype))
        return timings_against(stats, eager, base, cached, want_compile=want_compile, quick=quick, bound_ms=bound,
                               device=census.device if census is not None else None,
                               eager_device=census.reference_device if census is not None else None)

