"""The input sets and checks of one candidate against its reference, and its timed series (worker side).

One set's run and check is `harness.worker.set_checks.SetChecks`, the timed series
`harness.worker.timed_checks.TimedChecks`; `Checker` runs the sequence of sets and reads their patterns.

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

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from kb_mcp.harness.judgment.verdict import Failure, FailureKind, Finding, FindingCode, InputSetCheck
from kb_mcp.harness.worker.distributions import SETS, Variant, vary
from kb_mcp.harness.worker.fault import Halted, ProblemBroken, first_line, is_cuda_error, is_out_of_memory
from kb_mcp.harness.worker.perturb import map_parameters, parameter_infos, perturb
from kb_mcp.harness.worker.set_checks import SetChecks, digests
from kb_mcp.harness.worker.values import (
    MAX_PERTURBED_INPUTS,
    PUBLIC_SEED,
    all_finite,
    clone_inputs,
    leaves,
    secret_seed,
)


@dataclass
class _SetRecord:
    """What is kept of a secret input set once it is dropped: its check, its seed (to make it again)
    and digests of the reference's and the candidate's outputs (`values.digest`)."""

    check: InputSetCheck
    seed: int
    ref: list[tuple[int, int, int]] | None
    out: list[tuple[int, int, int]] | None



class Checker(SetChecks):
    """Input sets, checks and timing of one candidate against its reference."""

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
