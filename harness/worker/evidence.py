"""More evidence for a result that looks too good (worker side): it then counts or is rejected.

A candidate faster than `implausible_speedup` times the best baseline, or faster than the
reference's roofline allows, may be a fake or may have found less work to do (an exact algebraic
rewrite). `escalate` settles which, after the timing (`harness.plausibility` says why each step):

1. more input sets from secret seeds (`EXTRA_SETS`);
2. the parameters perturbed again (`PERTURB_ROUNDS` more rounds, matched by structure:
   `harness.worker.perturb`);
3. a second shape: a copy of the problem module with its size constants halved
   (`harness.shapes`), the first whose reference runs; ModelNew built there from the same seed
   as the reference and compared on `SHAPE_SETS` input sets. A candidate that raises, or returns
   another shape, there supports only the problem's sizes: noted, not held against it; one that
   runs and returns wrong values is `incorrect`;
4. the work census (hardware counters of one forward, taken by the pool under Nsight Compute:
   `profiling.work`) against the device's peaks: a median below the bound is `impossible_time`.

A failed check makes the verdict `incorrect` or `invalid` as anywhere else; everything passed
makes it count, with the evidence in `Timings.evidence` (and so in the summary). Only when the
work census cannot be taken (no ncu, counters refused) does the result stay held, and the hold
says why.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from kb_mcp.harness import shapes
from kb_mcp.harness.judgment.verdict import Finding, InputSetCheck, Timings
from kb_mcp.harness.plausibility import (
    DevicePeaks,
    escalation_reasons,
    impossible_time,
    unsettled,
    work_bound,
)
from kb_mcp.harness.worker.checks import Checker
from kb_mcp.harness.worker.fault import is_cuda_error, is_out_of_memory
from kb_mcp.harness.worker.roofline import dram_bandwidth
from kb_mcp.harness.worker.values import clone_inputs, compare, largest, leaves, secret_seed, tolerance_for

__all__ = ["EXTRA_SETS", "PERTURB_ROUNDS", "SHAPE_SETS", "device_peaks", "escalate"]

EXTRA_SETS = 8
PERTURB_ROUNDS = 2
SHAPE_SETS = 2


def device_peaks(props: Any) -> DevicePeaks:
    """The device's peaks from its CUDA properties (clock in kHz, as CUDA reports it)."""
    clock_khz = getattr(props, "clock_rate", 0) or 0
    return DevicePeaks(
        dram_bytes_per_s=dram_bandwidth(props),
        sm_count=getattr(props, "multi_processor_count", None) or None,
        sm_clock_hz=clock_khz * 1e3 or None,
        l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
    )


def escalate(v: Any, checker: Checker, timings: Timings) -> list[Finding]:
    """Gathers the evidence for a result that escalates (none for one that does not); returns the
    findings it adds. `v` is the `verify.GpuVerification`: its sets and findings grow here."""
    reasons = escalation_reasons(timings, v.options.implausible_speedup)
    if not reasons:
        return []  # nothing more runs: the verification's end frees what the checks held
    checker.release()  # the evidence's runs need the memory the timed series left cached
    v._phase("evidence")
    first, noted = len(v.sets), len(v.findings)
    index = itertools.count(max((c.index for c in v.sets), default=-1) + 1)
    with torch.no_grad():
        for _ in range(EXTRA_SETS):
            checker.one_set(next(index), "secret", checker.make_inputs(secret_seed()))
        for _ in range(PERTURB_ROUNDS):
            checker._perturbed(index)
        shape_note = second_shape(v, checker, index)
    added = v.sets[first:]
    if any(not c.passed for c in added) or len(v.findings) > noted:
        return []  # a failed set or a finding decides (incorrect, or invalid)
    ran = [c for c in added if not c.skipped]
    perturbed = sum(1 for c in ran if c.kind == "perturbed")
    evidence = [f"escalated ({reasons[0]})",
                f"{len(ran)} more input sets correct ({len(ran) - perturbed - _count(ran, 'second_shape')} secret "
                f"seeds, {perturbed} with perturbed parameters, {_count(ran, 'second_shape')} at a second shape)",
                shape_note]
    reply = v.ask_census(counters=True)
    work = reply.work
    bound = work_bound(work, device_peaks(v.env.props))
    if bound is None:
        timings.evidence = evidence
        why = work.note if work is not None and work.note else "the device does not report its peaks"
        return [unsettled(reasons, f"its own work could not be measured ({why}); the other evidence passed")]
    timings.work_bound_ms = round(bound.ms, 6)
    found = impossible_time(timings.candidate_ms, bound)
    if found is not None:
        return [found]
    limits = f" ({work.note})" if work is not None and work.note else ""
    evidence.append(f"its own work takes at least {bound.describe()}: consistent with "
                    f"{timings.candidate_ms * 1e3:.3g} us{limits}")
    timings.evidence = evidence
    return []


def _count(sets: list[InputSetCheck], kind: str) -> int:
    return sum(1 for c in sets if c.kind == kind)


def second_shape(v: Any, checker: Checker, index: Any) -> str:
    """Checks the candidate at a second shape of the problem where one runs; returns what was done."""
    plans = shapes.variants(v.problem.source)
    if not plans:
        return "no second shape (get_inputs/get_init_inputs read no size constants)"
    found = None
    for plan in plans:
        try:
            found = _reference_at(v, plan)
            break
        except Exception as exc:  # the problem does not allow this shape: try the next
            if is_cuda_error(exc):  # not a shape the problem refuses: whose fault it is, `fault.Blame` decides
                raise
            continue
    if found is None:
        return f"no second shape (the reference does not run at {plans[0].describe()})"
    plan, pmod, init, seed, ref = found
    where = f"second shape {plan.describe()}"
    torch.manual_seed(seed)
    v.blame.calling(f"constructing ModelNew at a {where}")
    try:
        with checker.guard.watch_setup():
            cand = type(checker.cand)(*init).cuda().eval()
    except Exception as exc:  # noqa: BLE001 - a candidate may support only the problem's sizes
        if is_cuda_error(exc):
            raise v._failure(exc, f"constructing ModelNew at a {where}") from None
        return _skip(checker, index, f"{where}: ModelNew does not construct there ({type(exc).__name__}); not checked")
    except BaseException as exc:  # noqa: BLE001 - exits and interrupts end the verification
        raise v._failure(exc, "constructing ModelNew at a second shape") from None
    torch.manual_seed(secret_seed())
    at_shape = Checker(v, pmod, ref, cand, checker.guard)
    for _ in range(SHAPE_SETS):
        note = _one_shape_set(v, at_shape, index, where)
        if note:
            return note
    return f"checked at a {where}"


def _reference_at(v: Any, plan: shapes.ShapeVariant) -> tuple[shapes.ShapeVariant, Any, list[Any], int, Any]:
    """The problem at `plan`'s sizes: module, init inputs, weight seed and a reference that ran once."""
    pmod = v._load(plan.source, "kbmcp_problem_shape")
    init = [x.cuda() if isinstance(x, torch.Tensor) else x for x in pmod.get_init_inputs()]
    seed = secret_seed()
    torch.manual_seed(seed)
    ref = pmod.Model(*init).cuda().eval()
    torch.manual_seed(secret_seed())
    with torch.device("cuda"), torch.no_grad():
        xs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in pmod.get_inputs()]
        ref(*xs)
    torch.cuda.synchronize()
    return plan, pmod, init, seed, ref


def _one_shape_set(v: Any, at: Checker, index: Any, where: str) -> str:
    """One input set at the second shape; returns a note when the candidate cannot run there."""
    xs = at.make_inputs(secret_seed())
    ref_out = at.ref_run(xs)
    v.blame.calling(f"ModelNew.forward at a {where}")
    try:
        out = at.cand(*clone_inputs(xs))
        at.sync()
    except Exception as exc:  # a candidate may support only the problem's sizes
        if is_out_of_memory(exc):
            raise  # weighed in the stage loop, once the harness's sets are let go (`fault.Blame`)
        if is_cuda_error(exc):
            raise v._failure(exc, f"ModelNew.forward at a {where}") from None
        return _skip(at, index, f"{where}: ModelNew raised there ({type(exc).__name__}); not checked")
    except BaseException as exc:  # noqa: BLE001
        raise v._failure(exc, f"ModelNew.forward at a {where}") from None
    r_leaves, c_leaves = leaves(ref_out) or [], leaves(out)
    if c_leaves is None or len(c_leaves) != len(r_leaves) or any(
            type(c) is not torch.Tensor or c.shape != r.shape or c.dtype != r.dtype
            for c, r in zip(c_leaves, r_leaves)):
        return _skip(at, index, f"{where}: ModelNew returns another shape there (it supports the problem's sizes "
                                "only); not checked")
    comps = []
    for c, r in zip(c_leaves, r_leaves):
        atol, rtol, _ = tolerance_for(r.dtype, at.atol, at.rtol, v.options)
        comps.append(compare(c, r, atol, rtol))
    bad = next((cm for cm in comps if not cm.passed), None)
    v.sets.append(InputSetCheck(
        index=next(index), kind="second_shape", passed=bad is None,
        max_abs_err=largest(cm.max_abs for cm in comps), max_rel_err=largest(cm.max_rel for cm in comps),
        scaled_err=largest(cm.scaled for cm in comps), mismatched=sum(cm.mismatched for cm in comps),
        numel=sum(cm.numel for cm in comps),
        message="" if bad is None else (f"at the {where}, ModelNew ran and returned wrong values ({bad.message}); a "
                                        "candidate that supports only the problem's sizes must raise at others"),
    ))
    return ""


def _skip(at: Checker, index: Any, message: str) -> str:
    at.v.sets.append(InputSetCheck(index=next(index), kind="second_shape", passed=True, skipped=True, message=message))
    return message
