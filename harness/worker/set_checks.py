"""One input set of a candidate's checks, against its reference (worker side; imports torch).

For each set the reference runs first on a clone of the inputs and its output stays alive; the
caching allocator is filled with poison (0xFF bytes: NaN for floats) in blocks of the output's
size; the candidate runs under the integrity guard on its own clone; then output type, shape,
dtype and device are checked exactly, inputs must be unchanged, the output must not share memory
with the reference's, values must be finite and within tolerance. A floating output outside the
tolerance by a rounding-sized margin is judged once more against a float64 copy of the reference
on the same inputs (`harness.worker.rounding`, the precision probes' rule). `SetChecks` makes the
sets, runs both models on them and checks each; `harness.worker.checks.Checker` runs the sequence
of sets and reads the patterns of their results.
"""


from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

from kb_mcp.harness.gpu.memory import Footprint, MemoryPlan, SetPeak
from kb_mcp.harness.judgment.verdict import Failure, FailureKind, Finding, FindingCode, InputSetCheck
from kb_mcp.harness.worker.distributions import SETS, vary
from kb_mcp.harness.worker.fault import Halted, is_out_of_memory
from kb_mcp.harness.worker.footprint import PeakMeter, nbytes
from kb_mcp.harness.worker.integrity import IntegrityGuard
from kb_mcp.harness.worker.perturb import ParamMapping
from kb_mcp.harness.worker.pristine import Pristine
from kb_mcp.harness.worker.rounding import RoundingJudge
from kb_mcp.harness.worker.timed_checks import TimedChecks
from kb_mcp.harness.worker.values import (
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


def digests(out: Any) -> list[tuple[int, int, int]] | None:
    """Digests of an output's tensors (None for an output that is no tensor or tuple of them)."""
    ls = leaves(out)
    return None if ls is None else [digest(t) for t in ls]



class SetChecks(TimedChecks):
    """One input set at a time, made, run by both models and checked, and the timing (`TimedChecks`)."""

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
