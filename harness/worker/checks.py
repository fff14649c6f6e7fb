"""The input sets and checks of one candidate against its reference, and its timed series (worker side).

For each set the reference runs first on a clone of the inputs and its output stays alive; the
caching allocator is filled with poison (0xFF bytes: NaN for floats) in blocks of the output's
size; the candidate runs under the integrity guard on its own clone; then output type, shape,
dtype and device are checked exactly, inputs must be unchanged, the output must not share memory
with the reference's, values must be finite and within tolerance. One set is re-run (a second run
must agree) and one with new values written into the previous set's input buffers (results cached
on pointers or shapes fail there). A floating output outside the tolerance by a rounding-sized
margin is judged once more against a float64 copy of the reference on the same inputs
(`harness.worker.rounding`, the precision probes' rule): where the candidate errs at most
`PROBE_BOUND` times what the float32 reference itself errs, the difference is the reference's own
rounding (long sums of large values, small outputs after a cancellation) and the set passes, the
ratio recorded with it; each timed run's output is judged the same way. Then the patterns:
public-only passes (`seed_prediction`), shifted-only failures (`distribution_shortcut`), small
errors everywhere (`precision_lowered`), parameters perturbed in both models (`ignores_inputs`).

A problem may define `get_shifted_inputs()` for the different-distribution set; otherwise two sets
vary the floating inputs of fresh sets (`harness.worker.distributions`: signs mixed per element with
zeros, values around activation knees and magnitudes 1/8-8x; every input negated and stretched),
each with a gentler fallback where the reference is not finite, and skipped (saying so) where the
fallback is not finite either.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from kb_mcp.harness.gpu.memory import Footprint, MemoryPlan, SetPeak
from kb_mcp.harness.judgment.verdict import Failure, FailureKind, Finding, FindingCode, InputSetCheck
from kb_mcp.harness.worker.distributions import SETS, Variant, vary
from kb_mcp.harness.worker.fault import Halted, ProblemBroken, first_line, is_cuda_error, is_out_of_memory
from kb_mcp.harness.worker.footprint import PeakMeter, nbytes
from kb_mcp.harness.worker.integrity import IntegrityGuard
from kb_mcp.harness.worker.perturb import ParamMapping, map_parameters, parameter_infos, perturb
from kb_mcp.harness.worker.pristine import Pristine
from kb_mcp.harness.worker.rounding import RoundingJudge
from kb_mcp.harness.worker.timed_checks import TimedChecks
from kb_mcp.harness.worker.values import (
    MAX_PERTURBED_INPUTS,
    PUBLIC_SEED,
    all_finite,
    clone_inputs,
    compare,
    digest,
    largest,
    leaves,
    overlaps,
    poison_allocator,
    same,
    secret_seed,
    tolerance_for,
)


@dataclass
class _SetRecord:
    """What is kept of a secret input set once it is dropped: its check, its seed (to make it again)
    and digests of the reference's and the candidate's outputs (`values.digest`)."""

    check: InputSetCheck
    seed: int
    ref: list[tuple[int, int, int]] | None
    out: list[tuple[int, int, int]] | None


def digests(out: Any) -> list[tuple[int, int, int]] | None:
    """Digests of an output's tensors (None for an output that is no tensor or tuple of them)."""
    ls = leaves(out)
    return None if ls is None else [digest(t) for t in ls]


class Checker(TimedChecks):
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
        self.alive: list[Any] = []  # the current set's reference output stays alive while the candidate runs
        fp: Footprint = v.footprint
        plan: MemoryPlan = v.plan
        self.footprint = fp
        self.pristine = Pristine(plan.pristine)  # on the device, or in host memory (`harness.gpu.memory`)
        self.host_pristine = self.pristine.on_host
        self.poison_copies = plan.poison_copies
        self.ref_keeps_inputs: bool | None = None  # the reference leaves its inputs alone (seen on the first set)
        self.io_bytes = fp.input_bytes + fp.output_bytes
        self.flops = fp.flops
        self.dtype: torch.dtype = getattr(torch, fp.dtype, torch.float32)
        self.dtypes: set[str] = set(fp.dtypes)  # the problem's floating dtypes (inputs, outputs, parameters)
        self.lowered: list[int] = []  # failed sets whose errors look like a lower precision
        self.set_peaks: list[SetPeak] = []  # the peaks between set boundaries (`MemoryReport.set_peaks`)
        self._sets_noted = 0  # how many of `v.sets` the noted peaks cover
        self._live_at_note = 0  # what was live when the last interval began
        self.mapping: ParamMapping | None = None  # Model's parameters to ModelNew's (`perturb.map_parameters`)
        self.ref_params: dict[str, torch.nn.Parameter] = {}
        self.cand_params: dict[str, torch.nn.Parameter] = {}
        self._stale = False  # the reused-buffer run returned set 1's output again (`_reused_buffers`)
        self.judge = RoundingJudge(ref)  # the float64 judgment of rounding-sized failures
        self._outputs: dict[int, tuple[Any, Any]] = {}  # each set's (reference, candidate) output digests

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

    def new_set(self, seed: int, shifted: bool = False) -> list[Any]:
        """`make_inputs` at a set's boundary: the last set's reference output let go and the cached
        blocks given back first, so the new set's large tensors never need a segment of their own
        beside blocks that a small temporary split (the caching allocator keeps split blocks, and
        the device's peak would grow by a whole set each time). Not for the timed runs' inputs: a
        timed run finds the cache as the last one left it."""
        self.alive = []
        self.v.renew()  # the phase's limit restarts: each set has the whole of it
        self.note_peaks()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return self.make_inputs(seed, shifted)

    def note_peaks(self) -> None:
        """Closes the interval since the last set boundary: its allocator peaks (live and reserved)
        under the kinds of the sets checked in it, the reserved peak carried for the stage and the
        request (`footprint.PeakMeter`), and the peaks reset for the next interval. Nothing without CUDA."""
        if not torch.cuda.is_available():
            return
        kinds = [s.kind for s in self.v.sets[self._sets_noted:]]
        self._sets_noted = len(self.v.sets)
        reserved, allocated = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
        self.v.peaks.append(reserved)
        self.set_peaks.append(SetPeak(sets="+".join(kinds) or "setup", start_bytes=self._live_at_note,
                                      allocated_bytes=allocated, reserved_bytes=reserved))
        self._live_at_note = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    @staticmethod
    def _shift(xs: list[Any], seed: int) -> list[Any]:
        """`xs` of a different distribution: the first variant of `distributions.SETS`."""
        return vary(xs, seed, SETS[0][0])

    # -- runs -------------------------------------------------------------------------------

    def ref_run(self, xs: list[Any]) -> Any:
        """The reference output for `xs`, kept alive while the candidate runs on the same set: on a
        clone of `xs`, or on `xs` itself where the pristine copy is on the host (`one_set`). The
        first run measures eager's peak memory (`Footprint.eager_peak_bytes`) and whether the
        reference writes into its inputs."""
        self.alive = []  # the last set's output goes before this one's is made
        args = xs if self.host_pristine else clone_inputs(xs)
        if self.footprint.eager_peak_bytes is None:
            with PeakMeter(self.v.peaks) as meter:
                out = self.ref(*args)
            self.footprint = self.v.footprint = self.footprint.model_copy(update={
                "eager_peak_bytes": self.footprint.param_bytes + nbytes(xs) + meter.extra})
            if not self.host_pristine:
                self.ref_keeps_inputs = all(same(a, x) for a, x in zip(args, xs) if isinstance(x, torch.Tensor))
                del args
        else:
            out = self.ref(*args)
        self.alive = [out]
        return out

    def ref_args(self, xs: list[Any]) -> list[Any]:
        """What the reference runs on outside the checks (the timed series' references): `xs` itself
        where it was seen to leave its inputs alone, else a clone."""
        return xs if self.ref_keeps_inputs is True else clone_inputs(xs)

    def release(self) -> None:
        """Drops what the checks held and gives the cached blocks back, before another process (the
        census worker) or another phase (timing, torch.compile) needs the device's memory."""
        self.alive = []
        gc.collect()
        torch.cuda.empty_cache()

    def cand_run(self, args: list[Any], ref_out: Any, watch: bool = True) -> Any:
        """One candidate call on `args` with the allocator poisoned in blocks the output's size. What
        the call raises, or leaves for the synchronize to report, is the candidate's (`fault.Blame`)."""
        ls = leaves(ref_out) or []
        poison_allocator([t.untyped_storage().nbytes() for t in ls] * self.poison_copies)
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
              pristine: list[Any] | None = None, ref_inputs: list[Any] | None = None,
              remake: Callable[[], list[Any]] | None = None) -> InputSetCheck:
        """Compares one output with the reference and records findings; returns the set's result.
        `remake()` makes the set's inputs again from their seed where no pristine copy is at hand
        (for the float64 judgment of a rounding-sized failure)."""
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
            for i in self.pristine.changed(args, pristine):
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
        message = first_bad.message if first_bad else ""
        ratio: float | None = None
        if self.judge.applies(comps, r_leaves):
            kept = pristine if pristine is not None else ref_inputs
            inputs: Callable[[], list[Any] | None] = (lambda: kept) if kept is not None or remake is None else remake
            passed, message, ratio = self._rounding_failure(index, message, c_leaves, r_leaves, inputs)
        self._earlier_output(index, passed or any(cm.constant for cm in comps), out, ref_out)
        return self._record(InputSetCheck(
            index=index, kind=kind, passed=passed,
            max_abs_err=largest(cm.max_abs for cm in comps), max_rel_err=largest(cm.max_rel for cm in comps),
            scaled_err=largest(cm.scaled for cm in comps), mismatched=sum(cm.mismatched for cm in comps),
            numel=sum(cm.numel for cm in comps), message=message, float64_ratio=ratio,
        ))

    def _earlier_output(self, index: int, explained: bool, out: Any, ref_out: Any) -> None:
        """`result_caching` where a wrong output is, byte for byte, the candidate's output of an earlier
        set whose reference output differs: forward returned an earlier call's result (kept on the
        input's address or shape; a new set's inputs often land where an earlier set's were)."""
        pair = (digests(ref_out), digests(out))
        earlier = next((i for i, (r, o) in self._outputs.items() if o == pair[1] and r != pair[0]), None)
        self._outputs[index] = pair
        if explained or earlier is None or any(f.code == FindingCode.result_caching for f in self.v.findings):
            return
        self.v.findings.append(Finding(code=FindingCode.result_caching, message=(
            f"on input set {index} forward returned exactly its output of input set {earlier}, whose inputs and "
            "reference output differ: results must not be cached on pointers, shapes or earlier calls")))

    def _digests(self, index: int, ref_out: Any, out: Any) -> tuple[Any, Any]:
        """Set `index`'s (reference, candidate) output digests: those `check` took, else taken now."""
        return self._outputs.get(index) or (digests(ref_out), digests(out))

    def _rounding_failure(self, index: int, message: str, c_leaves: list[torch.Tensor], r_leaves: list[torch.Tensor],
                          inputs: Callable[[], list[Any] | None]) -> tuple[bool, str, float | None]:
        """A set failed by a rounding-sized margin, judged against float64 (`rounding.RoundingJudge`):
        (passed, message, ratio). Failing that too, the set counts toward `precision_lowered`."""
        judged = self.judge.judge(message, c_leaves, r_leaves, inputs)
        if not judged.passed:
            self.lowered.append(index)
        return judged.passed, judged.message, judged.ratio

    def _record(self, check: InputSetCheck) -> InputSetCheck:
        self.v.sets.append(check)
        return check

    def one_set(self, index: int, kind: str, xs: list[Any]) -> tuple[InputSetCheck, Any, Any, list[Any]]:
        """Reference, then candidate, then the check. Returns (check, ref_out, out, args)."""
        pristine = self.keep_pristine(xs)
        ref_out = self.ref_run(xs)
        chk, out, args = self.cand_check(index, kind, xs, pristine, ref_out)
        return chk, ref_out, out, args

    def keep_pristine(self, xs: list[Any]) -> list[Any]:
        """The copy of `xs` the candidate's inputs are checked against: `xs` itself (the candidate gets
        a clone), or, where the plan keeps pristine copies on the host, a copy there (taken before
        the reference runs on `xs`; `pristine.Pristine`)."""
        return self.pristine.keep(xs)

    def cand_check(self, index: int, kind: str, xs: list[Any], pristine: list[Any],
                   ref_out: Any) -> tuple[InputSetCheck, Any, list[Any]]:
        """The candidate on set `xs` (after the reference), then the check. Returns (check, out, args).

        With pristine copies on the host the candidate gets `xs` itself, put back first where the
        reference wrote into it; the reference's inputs are then the candidate's own, so only the
        reference's output is memory the candidate's output may not share."""
        if self.host_pristine:
            changed = self.pristine.changed(xs, pristine)
            if self.ref_keeps_inputs is None:
                self.ref_keeps_inputs = not changed
            self.pristine.restore(xs, pristine, changed)
            args, ref_inputs = xs, []
        else:
            args, ref_inputs = clone_inputs(xs), xs
        out = self.cand_run(args, ref_out)
        return self.check(index, kind, ref_out, out, args, pristine, ref_inputs), out, args

    def finite_set(self, xs: list[Any], skipped: InputSetCheck) -> InputSetCheck | None:
        """A set the reference may not be finite on (another distribution, perturbed parameters): the
        check of the candidate on it, or None where the reference is not finite there (`skipped`,
        recorded in its place, says so)."""
        pristine = self.keep_pristine(xs)
        ref_out = self.ref_run(xs)
        if not all(all_finite(t) for t in leaves(ref_out) or [] if t.is_floating_point()):
            self._record(skipped)
            return None
        return self.cand_check(skipped.index, skipped.kind, xs, pristine, ref_out)[0]

    def run_sets(self) -> None:
        """Every input set and the derived checks (caching, repeat, census, shortcuts), one set on the
        device at a time: each is made from its seed, checked and dropped, and what a later check
        needs of it is its seed or a digest (`values.digest`); set 1's input buffers are kept only for
        the caching check right after set 1 (new values written into them)."""
        v = self.v
        opts = v.options
        index = itertools.count()
        if self.footprint.method == "device":
            self._measure(self.new_set(PUBLIC_SEED))
        public = self.one_set(next(index), "public_seed", self.new_set(PUBLIC_SEED))[0]
        secret: list[_SetRecord] = []
        reused: InputSetCheck | None = None
        for k in range(opts.input_sets):
            seed = secret_seed()
            chk, ref_out, out, args = self.one_set(next(index), "secret", self.new_set(seed))
            secret.append(_SetRecord(chk, seed, *self._digests(chk.index, ref_out, out)))
            del ref_out, out
            self.alive = []
            if k == 0:  # set 1's own buffers get new values next: a result cached on them shows
                reused = self._reused_buffers(next(index), args, secret[0])
            del args
        if reused is not None and len(secret) > 1:
            self._caching_finding(reused, secret[0], secret[1])
        for s in opts.seeds:
            self.one_set(next(index), "user_seed", self.new_set(int(s)))
        self._shifted(index)
        # The first (public) set again, made again from its seed: does it still agree?
        repeat = self._repeat(next(index), public)
        self._patterns(public, repeat, secret, index)
        self.note_peaks()

    def _patterns(self, public: InputSetCheck, repeat: InputSetCheck, secret: list[_SetRecord],
                  index: Iterator[int]) -> None:
        """What the pattern of failures says (seed prediction, ignored inputs, lowered precision),
        with the perturbed parameters' set in between."""
        v = self.v
        secret_failed = [r.check for r in secret if not r.check.passed]
        cached = any(f.code == FindingCode.result_caching for f in v.findings)  # explains the pattern
        if public.passed and repeat.passed and secret_failed and len(secret_failed) == len(secret) and not cached:
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

    def _reused_buffers(self, index: int, args1: list[Any], first: _SetRecord) -> InputSetCheck:
        """New values from a fresh secret seed written into set 1's own input buffers (the same
        pointers and shapes the candidate saw): its output must be the new values' output. Set 1's
        other tensors are gone by then, so this costs no more memory than a set of its own."""
        self.note_peaks()  # this check's peak apart from set 1's
        seed = self._refill(args1)
        # ref_run clones where pristine copies stay on the device; on the host path it runs on what it gets
        ref_out = self.ref_run(clone_inputs(args1) if self.host_pristine and not self.ref_keeps_inputs else args1)
        out = self.cand_run(args1, ref_out)
        chk = self.check(index, "reused_buffers", ref_out, out, remake=lambda: self.make_inputs(seed))
        self._stale = first.out is not None and self._digests(index, ref_out, out)[1] == first.out
        return chk

    def _refill(self, args1: list[Any]) -> int:
        """Writes a fresh secret set's values into `args1`; returns its seed (the candidate may write
        into `args1`, so a pristine copy is made again from it). In a function of its own so that the
        fresh set is gone when it returns (a loop variable of the caller would keep its last tensor
        alive: a whole input's size beside the reference and the poisoned blocks)."""
        seed = secret_seed()
        fresh = self.make_inputs(seed)
        for a, x in zip(args1, fresh):
            if isinstance(a, torch.Tensor) and isinstance(x, torch.Tensor) and a.shape == x.shape:
                a.copy_(x)
        return seed

    def _caching_finding(self, reused: InputSetCheck, first: _SetRecord, second: _SetRecord) -> None:
        """`result_caching` where set 1's buffers with new values gave a wrong output although set 1
        and set 2 (fresh buffers) were both right."""
        if reused.passed or not first.check.passed or not second.check.passed:
            return
        self.v.findings.append(Finding(
            code=FindingCode.result_caching,
            message=("given new values in the same input buffers, forward returned "
                     + ("its previous result" if self._stale else "a wrong result")
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
            xs = (self.new_set(seed, shifted=True) if variant is None
                  else vary(self.new_set(seed), seed, variant))
            name = "the problem's get_shifted_inputs()" if variant is None else variant.name
            pristine = self.keep_pristine(xs)
            ref_out, refused = self._reference_on(xs, name, problems_own=variant is None)
            if ref_out is not None:
                break
            why.append(f"{refused} on inputs with {name}")
            xs = pristine = []  # this set goes before the next variant's is made
        else:
            self._record(InputSetCheck(index=index, kind="shifted", passed=True, skipped=True,
                                       message="; ".join(why)))
            return
        chk = self.cand_check(index, "shifted", xs, pristine, ref_out)[0]
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
            ref_out = self.ref_run(xs)
            finite = all(all_finite(t) for t in leaves(ref_out) or [] if t.is_floating_point())
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

    def _repeat(self, index: int, first: InputSetCheck) -> InputSetCheck:
        """The public set again (made again from its seed): does a second run on the same inputs agree?"""
        chk = self.one_set(index, "repeat", self.new_set(PUBLIC_SEED))[0]
        if first.passed and not chk.passed:
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
        chk = self.finite_set(self.new_set(secret_seed()), InputSetCheck(
            index=next(index), kind="perturbed", passed=True, skipped=True,
            message="the reference is not finite with perturbed parameters"))
        if chk is None:
            return
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

    def _ignored_inputs(self, secret: list[_SetRecord]) -> None:
        """On a failure: is some input ignored? Swap one input at a time between the first two secret
        sets (made again from their seeds) and see if the output moves."""
        if len(secret) < 2:
            return
        a, b = secret[0], secret[1]
        xs_a = self.make_inputs(a.seed)
        tensor_idx = [i for i, x in enumerate(xs_a) if isinstance(x, torch.Tensor)][:MAX_PERTURBED_INPUTS]
        for i in tensor_idx:
            x_b = self.make_inputs(b.seed)[i]  # only the one input is kept
            if xs_a[i].shape != x_b.shape:
                continue
            mixed = list(xs_a)
            mixed[i] = x_b
            ref_m = self.ref(*clone_inputs(mixed))
            ref_moved = digests(ref_m) != a.ref
            ref_m = None
            out_m = self.cand_run(clone_inputs(mixed), None, watch=False)
            cand_still = digests(out_m) == a.out
            del out_m, mixed, x_b
            if ref_moved and cand_still:
                self.v.findings.append(Finding(
                    code=FindingCode.ignores_inputs,
                    message=f"the output does not change when input {i} changes (the reference's does): input {i} is "
                            "ignored",
                ))
