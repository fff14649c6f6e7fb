"""The verification pipeline a worker runs on one candidate (worker side; imports torch).

On a GPU: static checks, import (builds recorded), construction with a secret weight seed, then
input sets: one from a public seed (a cheat may guess it), at least five from secret seeds drawn
with `os.urandom` only when each set is made, any user seeds, and one of a different distribution.
For each set the reference runs first on a clone of the inputs and its output stays alive; the
caching allocator is filled with poison (0xFF bytes: NaN for floats) in blocks of the output's
size; the candidate runs under the integrity guard on its own clone; then output type, shape,
dtype and device are checked exactly, inputs must be unchanged, the output must not share memory
with the reference's, values must be finite and within tolerance. One set is re-run (a second run
must agree) and one with new values written into the previous set's input buffers (results cached
on pointers or shapes fail there). A candidate that passed everything then waits for the kernel
census, which the pool takes in its census worker (`harness.census`: this process never starts a
profiler session, so that its timings are those of a clean process). Then the reference's seal
(`ReferenceSeal`: the reference must be as the problem defines it, since it is timed here too),
timing (see `harness.timing`; eager interleaved with the candidate where it is timed anew: the
first measurement, and a launch-bound reference every time), baselines (`harness.baselines`) and
the verdict (`harness.verdict.decide`).

Without a GPU (or with `compile_only`): the candidate is imported with its builders intercepted,
the CUDA it would build is compiled with nvcc, and the verdict is `needs_gpu` or `compile_error`.

Tolerances: `|c - r| <= atol * RMS(r) + rtol * |r|` elementwise. Defaults per output dtype in
`DEFAULT_TOLERANCES`; a problem file may set module-level `ATOL` and `RTOL` floats; the caller's
options override both (a looser value flags the result for review).
A problem may also define `get_shifted_inputs()` for the different-distribution set; otherwise the
floating inputs of a fresh set are rescaled (sign kept, magnitudes stretched 1.5-4.5x unevenly), and
when the reference itself is not finite there, that set is skipped.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kb_mcp.harness.baselines import Baseline, BaselineCache
from kb_mcp.harness.candidate import static_units
from kb_mcp.harness.compile import DEFAULT_ARCH, Builders, NeedsGPU, all_units, capture_units, compile_only
from kb_mcp.harness.integrity import IntegrityGuard, check_source, dedupe
from kb_mcp.harness.integrity_runtime import TrustedSnapshot
from kb_mcp.harness.loading import load_module
from kb_mcp.harness.problem import Problem
from kb_mcp.harness.timing import (
    QUICK_RUNS,
    L2Flusher,
    RunStats,
    Series,
    Timer,
    dram_bandwidth,
    guards_active,
    peak_flops,
    roofline_ms,
    time_with_reference,
    timings_against,
)
from kb_mcp.harness.verdict import (
    CompileResult,
    Finding,
    FindingCode,
    InputSetCheck,
    Timings,
    VerifyOptions,
    VerifyResult,
    decide,
    plausibility_findings,
)
from kb_mcp.kb.models import Verdict

# (atol in units of the reference's RMS, rtol) per output dtype. fp32 is strict: the reference runs
# with TF32 off, and a candidate that computes in TF32/bf16 shows errors near 1e-3 and fails here.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
    "float8_e4m3fn": (1e-1, 1e-1),
    "float8_e5m2": (2e-1, 2e-1),
}
PUBLIC_SEED = 42  # the seed KernelBench-style harnesses use; a candidate may guess it, which is the point
POISON_BYTE = 0xFF  # 0xFFFF.. is NaN in every float format, and not the canonical NaN kernels produce
MAX_PERTURBED_INPUTS = 6
# A failing fp32/fp64 output whose largest error is at most this fraction of its RMS looks like
# lowered precision (TF32 ~1e-3, bf16 ~1e-2) rather than a wrong algorithm.
LOWERED_PRECISION_ERR = 3e-2


def secret_seed() -> int:
    """A fresh seed from the OS, drawn only when it is used."""
    return int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)


@dataclass
class WorkerEnv:
    """What a worker sets up once: device facts, builders, the trusted snapshot and the timer."""

    cache_dir: Path
    workdir: Path
    cuda: bool
    device: str = ""
    arch: str = ""
    torch_version: str = torch.__version__
    snapshot: TrustedSnapshot | None = None
    builders: Builders | None = None
    timer: Timer | None = None
    props: Any = None
    counter: itertools.count = field(default_factory=itertools.count)
    role: str = "verify"  # verify: checks and times candidates (never profiles); census: kernel census only
    start_guards: tuple[str, ...] = ()  # `timing.guards_active()` when the worker started (normally none)

    def new_guards(self) -> list[str]:
        """Guards active now that were not when the worker started (see `timing.guards_active`)."""
        return [g for g in guards_active() if g not in self.start_guards]

    @property
    def baselines(self) -> BaselineCache:
        """The baseline cache under the cache dir."""
        return BaselineCache(self.cache_dir)


class Stop(Exception):
    """Ends a verification early with a verdict (the candidate failed to build or crashed)."""

    def __init__(self, verdict: Verdict, summary: str, retire: bool = False) -> None:
        super().__init__(summary)
        self.verdict = verdict
        self.summary = summary
        self.retire = retire


class ProblemFault(Exception):
    """The problem itself failed before any candidate code ran (its module, inputs or Model raised):
    the problem's error, never a verdict on the candidate."""


# ---------------------------------------------------------------------------------------------
# Helpers: outputs, comparison, poison


def leaves(out: Any) -> list[Any] | None:
    """The tensors of an output (a tensor, or a tuple/list of tensors); None for anything else."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(x, torch.Tensor) for x in out):
        return list(out)
    return None


def tolerance_for(dtype: torch.dtype, problem_atol: float | None, problem_rtol: float | None,
                  options: VerifyOptions) -> tuple[float, float, str]:
    """(atol, rtol, loosened-note) for an output of `dtype`."""
    name = str(dtype).replace("torch.", "")
    base_a, base_r = DEFAULT_TOLERANCES.get(name, (0.0, 0.0))
    if problem_atol is not None:
        base_a = float(problem_atol)
    if problem_rtol is not None:
        base_r = float(problem_rtol)
    atol = base_a if options.atol is None else options.atol
    rtol = base_r if options.rtol is None else options.rtol
    note = ""
    if atol > base_a or rtol > base_r:
        note = f"tolerance loosened by the caller to atol={atol:g}, rtol={rtol:g} (the problem's is atol={base_a:g}, rtol={base_r:g})"
    return atol, rtol, note


@dataclass
class Comparison:
    """One output tensor against its reference."""

    passed: bool
    max_abs: float | None = None
    max_rel: float | None = None
    scaled: float | None = None
    mismatched: int = 0
    numel: int = 0
    nonfinite: int = 0
    poison: int = 0
    constant: bool = False
    message: str = ""


def _poison_count(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    raw = t.detach().contiguous().view(-1).view(torch.uint8).view(-1, t.element_size())
    return int((raw == POISON_BYTE).all(dim=1).sum().item())


def compare(c: torch.Tensor, r: torch.Tensor, atol: float, rtol: float, detail: bool = True) -> Comparison:
    """Elementwise check of `c` against `r` (NaN/Inf in `c` never pass).

    `detail=False` (the re-check of timed outputs) decides pass or fail by the same arithmetic but
    skips the statistics of a passing output (error maxima, constant-output test); a failing one
    gets them all, for its message.
    """
    n = r.numel()
    if not r.is_floating_point() and not r.is_complex():
        poison = _poison_count(c)
        bad = int((c != r).sum().item())
        return Comparison(passed=bad == 0, mismatched=bad, numel=n, poison=poison,
                          max_abs=float((c.long() - r.long()).abs().max().item()) if n else 0.0,
                          message="" if bad == 0 else f"{bad} of {n} elements differ (exact match required)")
    work = torch.float64 if r.dtype == torch.float64 else torch.float32
    rf = r.detach().to(work)
    cf = c.detach().to(work)
    finite_r = torch.isfinite(rf)
    finite_c = torch.isfinite(cf)
    if bool(finite_r.all().item()):  # the usual case: no mask to gather through
        scale = float(rf.pow(2).mean().sqrt().item()) if n else 1.0
    else:
        scale = float(rf[finite_r].pow(2).mean().sqrt().item()) if bool(finite_r.any()) else 1.0
    if scale == 0.0 or scale != scale:
        scale = 1.0
    diff = (cf - rf).abs()
    ok = diff <= (atol * scale + rtol * rf.abs())
    ok &= finite_c
    if not detail and bool(ok.all().item()):
        return Comparison(passed=True, numel=n)
    mismatched = int((~ok).sum().item())
    nonfinite = int((~finite_c).sum().item())
    # Poison bytes are NaN in every float format, so only a failing float output can hold any.
    poison = _poison_count(c) if mismatched else 0
    both = finite_c & finite_r
    max_abs = float(diff[both].max().item()) if bool(both.any()) else None
    big = both & (rf.abs() > 1e-3 * scale)
    max_rel = float((diff[big] / rf[big].abs()).max().item()) if bool(big.any()) else None
    constant = n > 1 and bool(finite_c.all()) and float(cf.max().item()) == float(cf.min().item()) and \
        bool(finite_r.all()) and float(rf.max().item()) != float(rf.min().item())
    message = ""
    if mismatched:
        parts = [f"{mismatched} of {n} elements outside the tolerance"]
        if nonfinite:
            parts.append(f"{nonfinite} NaN/Inf")
        if poison:
            parts.append(f"{poison} still hold the harness's poison bytes (never written)")
        if max_abs is not None:
            parts.append(f"max abs err {max_abs:.3g} (scale {scale:.3g})")
        message = "; ".join(parts)
    return Comparison(passed=mismatched == 0, max_abs=max_abs, max_rel=max_rel,
                      scaled=None if max_abs is None else max_abs / scale, mismatched=mismatched, numel=n,
                      nonfinite=nonfinite, poison=poison, constant=constant, message=message)


def poison_allocator(nbytes: list[int]) -> None:
    """Fills cached allocator blocks of these sizes with poison, then frees them for reuse."""
    bufs = []
    for n in nbytes:
        if n > 0:
            b = torch.empty(n, dtype=torch.uint8, device="cuda")
            b.fill_(POISON_BYTE)
            bufs.append(b)
    del bufs


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _overlaps(a: torch.Tensor, others: list[torch.Tensor]) -> bool:
    a0, a1 = _storage_span(a)
    if a1 == a0:
        return False
    for o in others:
        b0, b1 = _storage_span(o)
        if b1 > b0 and a0 < b1 and b0 < a1:
            return True
    return False


def clone_inputs(xs: list[Any]) -> list[Any]:
    """Tensors cloned, everything else as is (each call gets inputs of its own)."""
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all().item())
    return False


def _is_cuda_error(exc: BaseException) -> bool:
    name = type(exc).__name__
    text = str(exc)
    return name in ("AcceleratorError", "CudaError") or "CUDA error" in text or "cudaError" in text


def _context_healthy() -> bool:
    try:
        torch.cuda.synchronize()
        x = torch.ones(8, device="cuda")
        return float((x + 1).sum().item()) == 16.0
    except Exception:
        return False


def short_traceback(exc: BaseException, files: tuple[str, ...]) -> str:
    """The exception with the last lines of `files` it passed through."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in files]
    where = "; ".join(f"line {f.lineno}: {(f.line or '').strip()[:120]}" for f in frames[-3:])
    text = f"{type(exc).__name__}: {str(exc).strip()[:1500]}"
    return f"{text} (at {where})" if where else text


# ---------------------------------------------------------------------------------------------
# The reference's seal: the reference is timed in the process the candidate ran in


_FORWARD_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks")


def _code_attrs(namespace: dict[str, Any]) -> dict[str, Any]:
    """The functions, classes, modules and descriptors of a namespace: what would change a call's speed."""
    return {k: v for k, v in namespace.items()
            if k != "__dict__" and (callable(v) or isinstance(v, (ModuleType, property, staticmethod, classmethod)))}


def _instance_state(ref: torch.nn.Module) -> dict[str, tuple[type, dict[str, Any], tuple[int, ...]]]:
    """Per submodule of `ref`: its class, the callables set on the instance (a replaced `forward`)
    and its forward hook ids."""
    out = {}
    for name, m in ref.named_modules():
        own = {k: v for k, v in vars(m).items() if callable(v) and not isinstance(v, (torch.nn.Module, torch.Tensor))}
        out[name] = (type(m), own, tuple(m._forward_pre_hooks) + tuple(m._forward_hooks))
    return out


def _global_hooks() -> set[int]:
    mod = sys.modules["torch.nn.modules.module"]
    return {k for name in _FORWARD_HOOKS for k in getattr(mod, name, {})}


def _diff(where: str, before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    changed = [k for k in before if k not in now or now[k] is not before[k]]
    added = [k for k in now if k not in before]
    return [f"{where}{k} {'replaced' if k in now else 'removed'}" for k in changed] + [f"{where}{k} added" for k in added]


@dataclass
class ReferenceSeal:
    """What the reference's speed depends on in Python, captured before the candidate could touch it.

    The reference is timed in the process the candidate ran in (a first baseline, and a
    launch-bound reference again beside every candidate), so a candidate could slow it down to
    make a speedup: replace `Model.forward` or a function of the problem's module, set `forward`
    on the instance, or hook the reference's modules. `changes` lists any of that before timing.
    Taken in two steps: the problem's module and the global forward hooks right after the problem
    is imported (before the candidate's import), the reference instance right after it is built
    (before ModelNew's constructor runs).
    """

    module: dict[str, Any]
    classes: dict[str, dict[str, Any]]
    hooks: set[int]
    instances: dict[str, tuple[type, dict[str, Any], tuple[int, ...]]] = field(default_factory=dict)

    @classmethod
    def of_problem(cls, pmod: ModuleType) -> ReferenceSeal:
        """The problem module's code and its classes' attributes, and the global forward hooks."""
        module = _code_attrs(vars(pmod))
        classes = {k: _code_attrs(dict(vars(v))) for k, v in module.items()
                   if isinstance(v, type) and v.__module__ == pmod.__name__}
        return cls(module=module, classes=classes, hooks=_global_hooks())

    def seal_instance(self, ref: torch.nn.Module) -> None:
        """Adds the reference instance (and its submodules) as built."""
        self.instances = _instance_state(ref)

    def changes(self, pmod: ModuleType, ref: torch.nn.Module) -> list[str]:
        """What changed since the seal was taken (empty: the reference is as the problem defines it).

        A lazy module becoming its `cls_to_become`, or dropping the hook that did it, is not a
        change; only added hooks count."""
        found = _diff("problem module: ", self.module, _code_attrs(vars(pmod)))
        for name, attrs in self.classes.items():
            klass = self.module[name]
            found += _diff(f"{name}.", attrs, _code_attrs(dict(vars(klass))))
        if _global_hooks() - self.hooks:
            found.append("a global forward hook added (torch.nn.modules.module)")
        now = _instance_state(ref)
        for name, (klass, own, hooks) in self.instances.items():
            label = f"Model.{name}" if name else "the Model instance"
            if name not in now:
                found.append(f"{label} removed")
                continue
            klass_now, own_now, hooks_now = now[name]
            if klass_now is not klass and getattr(klass, "cls_to_become", None) is not klass_now:
                found.append(f"{label}: class changed to {klass_now.__qualname__}")
            found += _diff(f"{label}: ", own, own_now)
            if set(hooks_now) - set(hooks):
                found.append(f"{label}: forward hook added")
        found += [f"Model.{name} added" for name in now if name not in self.instances]
        return found


# ---------------------------------------------------------------------------------------------
# The GPU pipeline


class GpuVerification:
    """Verification of one candidate on the GPU; `run()` returns (result, retire_worker)."""

    def __init__(self, env: WorkerEnv, problem: Problem, source: str, options: VerifyOptions,
                 candidate_id: str, report: Callable[[str], None], ask_census: Callable[[], dict[str, Any]]) -> None:
        """`ask_census()` returns the census worker's `CensusReply` (as JSON) for this candidate: the
        worker asks the pool for it after the checks and waits, so no census overlaps the timing."""
        self.env = env
        self.ask_census = ask_census
        self.problem = problem
        self.source = source
        self.options = options
        self.candidate_id = candidate_id
        self.report = report
        self.findings: list[Finding] = []
        self.sets: list[InputSetCheck] = []
        self.files: tuple[str, ...] = ()
        self.loosened = ""
        self.tolerance: dict[str, float] = {}
        self.t0 = time.perf_counter()
        self.phase = "static"
        self.modules: list[str] = []

    # -- plumbing ------------------------------------------------------------------------------

    def _phase(self, name: str) -> None:
        self.phase = name
        self.report(name)

    def _result(self, verdict: Verdict, summary: str, compile: CompileResult, flagged: bool = False,
                timings: Timings | None = None, problem_error: str = "") -> VerifyResult:
        env = self.env
        return VerifyResult(
            candidate_id=self.candidate_id, problem=self.problem.name, problem_hash=self.problem.hash,
            verdict=verdict, summary=summary, flagged=flagged, compile=compile, input_sets=self.sets,
            findings=dedupe(self.findings), timings=timings, tolerance=self.tolerance, device=env.device,
            arch=env.arch, torch_version=env.torch_version, phase=self.phase, loosened=self.loosened,
            problem_error=problem_error, elapsed_s=round(time.perf_counter() - self.t0, 3),
        )

    def _compile_result(self) -> CompileResult:
        assert self.env.builders is not None
        return self.env.builders.result(self.env.arch)

    def _failure(self, exc: BaseException, what: str) -> Stop:
        """Turns an exception from candidate code into a Stop with the right verdict."""
        comp = self._compile_result()
        if not comp.ok:
            return Stop(Verdict.compile_error, f"compile error: {comp.messages[0] if comp.messages else 'build failed'}")
        if isinstance(exc, SyntaxError):
            return Stop(Verdict.compile_error, f"compile error: Python syntax error at line {exc.lineno}: {exc.msg}")
        if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc):
            torch.cuda.empty_cache()
            return Stop(Verdict.crashed, f"crashed: {what} ran out of GPU memory: {str(exc).strip().splitlines()[0][:300]}")
        if _is_cuda_error(exc):
            healthy = _context_healthy()
            state = "the CUDA context survived" if healthy else "the CUDA context is corrupted; worker replaced"
            # Even a context that still answers may hold the candidate's stray state: replace the worker.
            return Stop(Verdict.crashed, f"crashed: {what} raised a CUDA error ({state}): "
                        f"{str(exc).strip().splitlines()[0][:300]}", retire=True)
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            return Stop(Verdict.crashed, f"crashed: {what} tried to exit the worker ({type(exc).__name__})", retire=True)
        return Stop(Verdict.crashed, f"crashed: {what} raised {short_traceback(exc, self.files)}",
                    retire=not _context_healthy())

    def _load(self, source: str, stem: str) -> Any:
        name = f"{stem}_{next(self.env.counter)}"
        self.modules.append(name)
        return load_module(source, name, self.env.workdir)

    def cleanup(self) -> None:
        """Drops the modules this verification imported (fresh namespace for the next one)."""
        for name in self.modules:
            sys.modules.pop(name, None)
        gc.collect()
        if self.env.cuda:
            torch.cuda.empty_cache()

    # -- the pipeline --------------------------------------------------------------------------

    def _census(self, guard: IntegrityGuard) -> None:
        """Which kernels one forward launches, from the census worker (see `harness.census`)."""
        from kb_mcp.harness.census import CensusReply
        from kb_mcp.harness.integrity_runtime import KernelCensus

        self._phase("census")
        reply = CensusReply.model_validate(self.ask_census())
        self.findings += reply.findings
        if reply.census is not None:
            guard.last_census = KernelCensus.model_validate(reply.census)
        if reply.verdict is not None:
            raise Stop(reply.verdict, reply.summary)

    def run(self) -> tuple[VerifyResult, bool]:
        """The whole pipeline; never raises for candidate misbehaviour."""
        try:
            result, retire = self._run()
        except Stop as stop:
            result, retire = self._result(stop.verdict, stop.summary, self._compile_result()), stop.retire
        except ProblemFault as fault:
            result, retire = self._result(Verdict.crashed, f"the problem failed: {fault}", CompileResult(ok=True),
                                          problem_error=str(fault)), True
        finally:
            self.cleanup()
        # Whatever is left active (a mode, a trace function) would slow the next candidate's timed
        # runs and baselines: the next candidate gets a clean process instead.
        return result, retire or bool(self.env.new_guards())

    def _run(self) -> tuple[VerifyResult, bool]:
        env, opts = self.env, self.options
        assert env.builders is not None and env.timer is not None
        env.builders.reset()
        guard = IntegrityGuard(allow=opts.allow, trusted=env.snapshot)
        self._phase("static")
        self.findings += guard.check_source(self.source)

        self._phase("import")
        # The problem's module, inputs and Model come first: what fails before any candidate code
        # has run is the problem's fault, and the candidate cannot have touched the reference.
        try:
            pmod = self._load(self.problem.source, "kbmcp_problem")
        except Exception as exc:
            raise ProblemFault(f"its module failed to import: {short_traceback(exc, ())}") from exc
        seal = ReferenceSeal.of_problem(pmod)  # before the candidate's code runs
        seed = secret_seed()
        try:
            init = [x.cuda() if isinstance(x, torch.Tensor) else x for x in pmod.get_init_inputs()]
            torch.manual_seed(seed)
            ref = pmod.Model(*init).cuda().eval()
        except Exception as exc:
            raise ProblemFault(f"its Model failed to construct: {short_traceback(exc, ())}") from exc
        seal.seal_instance(ref)  # before the candidate's code runs
        try:
            with guard.watch_setup():
                cmod = self._load(self.source, "kbmcp_candidate")
        except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything
            self.files = (str(self.env.workdir / f"{self.modules[-1]}.py"),)
            raise self._failure(exc, "importing the candidate") from None
        self.files = (str(getattr(cmod, "__file__", "")),)
        model_new = getattr(cmod, "ModelNew", None)
        if not isinstance(model_new, type):
            raise Stop(Verdict.compile_error, "compile error: the candidate defines no class ModelNew")

        self._phase("construct")
        try:
            with guard.watch_setup():
                torch.manual_seed(seed)
                cand = model_new(*init).cuda().eval()
        except BaseException as exc:  # noqa: BLE001
            raise self._failure(exc, "constructing ModelNew") from None
        torch.manual_seed(secret_seed())
        self.findings += guard.attach(cmod, cand, reference=pmod.Model)

        self._phase("check")
        checker = _Checker(self, pmod, ref, cand, guard)
        with torch.no_grad():
            checker.run_sets()
        self.findings += guard.findings()
        comp = self._compile_result()
        retire = IntegrityGuard.retire_worker(self.findings)
        # `decide` without timings says needs_gpu when nothing is wrong yet; anything else ends here.
        verdict, flagged, summary = decide(comp, self.sets, self.findings, None, gpu=False, loosened=self.loosened)
        if verdict != Verdict.needs_gpu:  # failed to build, invalid or incorrect: no timing
            return self._result(verdict, summary, comp, flagged), retire

        self._census(guard)
        self.findings += guard.findings()
        verdict, flagged, summary = decide(comp, self.sets, self.findings, None, gpu=False, loosened=self.loosened)
        if verdict != Verdict.needs_gpu:  # library kernels, no kernel of its own, or the census worker saw a cheat
            return self._result(verdict, summary, comp, flagged), retire

        left = env.new_guards()
        if left:
            # Checked before timing: a mode or trace function left behind by the candidate would
            # slow every call timed in this process, the baselines' included.
            self.findings.append(Finding(
                code=FindingCode.harness_tampering,
                message=(f"after the candidate ran, {', '.join(left)} stayed active in the harness's process; that "
                         "slows every call timed there (the reference's too). Leave dispatch and function modes, "
                         "trace functions and the profiler as they were"),
            ))
            verdict, flagged, summary = decide(comp, self.sets, self.findings, None, gpu=False, loosened=self.loosened)
            return self._result(verdict, summary, comp, flagged), True
        changed = seal.changes(pmod, ref)
        if changed:
            # The reference is timed in this process next (beside the candidate, or for the cache).
            self.findings.append(Finding(
                code=FindingCode.harness_tampering,
                message=(f"the reference changed after the problem was loaded ({'; '.join(changed[:4])}); it is "
                         "timed in this process, so a slowed reference would fake a speedup. Leave the problem's "
                         "module and its Model alone"),
            ))
            verdict, flagged, summary = decide(comp, self.sets, self.findings, None, gpu=False, loosened=self.loosened)
            return self._result(verdict, summary, comp, flagged), True

        self._phase("timing")
        base = env.baselines.get(self.problem.hash, env.device, env.torch_version, need_compile=opts.compile_baseline)
        with torch.no_grad():
            stats, eager = checker.time_candidate(base)
        if stats.errors:
            self.findings.append(Finding(
                code=FindingCode.timed_output_mismatch, source="timing",
                message=(f"{len(stats.errors)} of {len(stats.gpu_ms)} timed runs returned wrong outputs "
                         f"({stats.errors[0]}) although the checked runs were correct; every call must compute "
                         "its result"),
            ))
        unsync = env.timer.unsynchronized(stats)
        if unsync:
            self.findings.append(Finding(code=FindingCode.unsynchronized_work, message=unsync, source="timing"))
        self.findings += guard.findings()
        retire = IntegrityGuard.retire_worker(self.findings)
        verdict, flagged, summary = decide(comp, self.sets, self.findings, None, gpu=False, loosened=self.loosened)
        if verdict != Verdict.needs_gpu:
            return self._result(verdict, summary, comp, flagged), retire

        self._phase("baselines")
        with torch.no_grad():
            timings = checker.timings(stats, eager, base)
        if not timings.baseline_cached:
            # A first torch.compile installs patches of its own (e.g. on nn.Module.__init__). The
            # candidate was checked against the pristine snapshot above; the next one is checked
            # against the state the trusted baseline left.
            env.snapshot = TrustedSnapshot.capture()
        self.findings += plausibility_findings(timings, opts.implausible_speedup)
        verdict, flagged, summary = decide(comp, self.sets, self.findings, timings, gpu=True, loosened=self.loosened)
        return self._result(verdict, summary, comp, flagged, timings), retire


class _Checker:
    """Input sets, checks and timing of one candidate against its reference."""

    def __init__(self, v: GpuVerification, pmod: Any, ref: torch.nn.Module, cand: torch.nn.Module,
                 guard: IntegrityGuard) -> None:
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
        self.lowered: list[int] = []  # failed sets whose errors look like a lower precision

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
        g = torch.Generator(device="cuda")
        g.manual_seed(seed ^ 0x5DEECE66D)
        out = []
        for x in xs:
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                factor = 1.5 + 1.5 * float(torch.rand((), generator=g, device="cuda").item())
                stretch = 1.0 + torch.rand(x.shape, generator=g, device="cuda", dtype=torch.float32)
                x = (x.float() * factor * stretch).to(x.dtype)
            out.append(x)
        return out

    # -- runs -------------------------------------------------------------------------------

    def ref_run(self, xs: list[Any]) -> Any:
        """The reference output for `xs` (on a clone), kept alive."""
        out = self.ref(*clone_inputs(xs))
        self.alive.append(out)
        return out

    def cand_run(self, args: list[Any], ref_out: Any, watch: bool = True) -> Any:
        """One candidate call on `args` with the allocator poisoned in blocks the output's size."""
        ls = leaves(ref_out) or []
        poison_allocator([t.untyped_storage().nbytes() for t in ls] * 2)
        self.sync()
        try:
            if watch:
                with self.guard.watch():
                    out = self.cand(*args)
            else:
                out = self.cand(*args)
            self.sync()
        except BaseException as exc:  # noqa: BLE001
            raise self.v._failure(exc, "ModelNew.forward") from None
        return out

    # -- checks -----------------------------------------------------------------------------

    def check(self, index: int, kind: str, ref_out: Any, out: Any, args: list[Any] | None = None,
              pristine: list[Any] | None = None, ref_inputs: list[Any] | None = None) -> InputSetCheck:
        """Compares one output with the reference and records findings; returns the set's result."""
        v = self.v
        r_leaves = leaves(ref_out)
        c_leaves = leaves(out)
        if r_leaves is None:
            raise Stop(Verdict.crashed, "crashed: the problem's Model returns something other than tensors")
        if c_leaves is None or len(c_leaves) != len(r_leaves):
            msg = (f"forward returned {type(out).__name__}, expected "
                   f"{'a tensor' if isinstance(ref_out, torch.Tensor) else f'{len(r_leaves)} tensors'}")
            v.findings.append(Finding(code=FindingCode.wrong_output_type, message=msg))
            return self._record(InputSetCheck(index=index, kind=kind, passed=False, message=msg))  # type: ignore[arg-type]
        problems: list[str] = []
        for c, r in zip(c_leaves, r_leaves):
            if type(c) is not torch.Tensor:
                problems.append(f"output is a {type(c).__module__}.{type(c).__qualname__}, not a plain torch.Tensor")
            elif c.shape != r.shape or c.dtype != r.dtype or c.device != r.device:
                problems.append(f"output is {tuple(c.shape)} {c.dtype} on {c.device}, expected "
                                f"{tuple(r.shape)} {r.dtype} on {r.device}")
        if problems:
            v.findings.append(Finding(code=FindingCode.wrong_output_type, message=problems[0] + "; return exactly what Model returns"))
            return self._record(InputSetCheck(index=index, kind=kind, passed=False, message=problems[0]))  # type: ignore[arg-type]
        theirs = [t for t in (r_leaves + [x for x in (ref_inputs or []) if isinstance(x, torch.Tensor)])]
        if any(_overlaps(c, theirs) for c in c_leaves):
            v.findings.append(Finding(
                code=FindingCode.reused_reference_output,
                message="the output shares memory with the reference's output or inputs; compute into memory of your own",
            ))
        if args is not None and pristine is not None:
            for i, (a, p) in enumerate(zip(args, pristine)):
                if isinstance(a, torch.Tensor) and not _same(a, p):
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
            index=index, kind=kind, passed=passed,  # type: ignore[arg-type]
            max_abs_err=_max(cm.max_abs for cm in comps), max_rel_err=_max(cm.max_rel for cm in comps),
            scaled_err=_max(cm.scaled for cm in comps), mismatched=sum(cm.mismatched for cm in comps),
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
        self._shifted(next(index))
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
        self._perturbed(next(index))
        failed = [c for c in v.sets if not c.passed]
        if failed and len(self.lowered) == len(failed):
            worst = max(c.scaled_err or 0.0 for c in failed)
            v.findings.append(Finding(
                code=FindingCode.precision_lowered,
                message=(f"errors up to {worst:.2g} of the output's RMS on {len(failed)} input sets: small, but beyond "
                         f"the {str(self.dtype).replace('torch.', '')} tolerance, as computing in a lower precision (TF32, "
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
            same_as_before = all(_same(a, b) for a, b in zip(leaves(out) or [], stale)) if stale else False
            self.v.findings.append(Finding(
                code=FindingCode.result_caching,
                message=("given new values in the same input buffers, forward returned "
                         + ("its previous result" if same_as_before else "a wrong result")
                         + ": results must not be cached on pointers, shapes or earlier calls"),
            ))

    def _shifted(self, index: int) -> None:
        xs = self.make_inputs(secret_seed(), shifted=True)
        ref_out = self.ref(*clone_inputs(xs))
        if not all(bool(torch.isfinite(t).all().item()) for t in leaves(ref_out) or [] if t.is_floating_point()):
            self._record(InputSetCheck(index=index, kind="shifted", passed=True,
                                       message="skipped: the reference is not finite on the shifted distribution"))
            return
        self.alive.append(ref_out)
        args = clone_inputs(xs)
        out = self.cand_run(args, ref_out)
        chk = self.check(index, "shifted", ref_out, out, args, xs, xs)
        others = [s for s in self.v.sets if s.kind in ("public_seed", "secret")]
        if not chk.passed and all(s.passed for s in others):
            self.v.findings.append(Finding(
                code=FindingCode.distribution_shortcut,
                message=("correct on the usual input distribution but wrong on inputs of a different distribution "
                         f"({chk.message}); the kernel must be correct for any valid input"),
            ))

    def _repeat(self, index: int, first: tuple) -> InputSetCheck:
        """A set again: does a second run on the same inputs agree with the first?"""
        chk1, xs, ref_out, out1, _ = first
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

    def _perturbed(self, index: int) -> None:
        """Parameters that ModelNew shares by name with Model get the same new random values in both;
        a candidate that does not read them (e.g. LayerNorm's weight 1 and bias 0 left out) fails here."""
        v = self.v
        ref_params = {n: p for n, p in self.ref.named_parameters() if p.is_floating_point()}
        cand_params = dict(self.cand.named_parameters())
        shared = [n for n, p in ref_params.items()
                  if n in cand_params and cand_params[n].shape == p.shape and cand_params[n].dtype == p.dtype]
        if not shared:
            return
        g = torch.Generator(device="cuda")
        g.manual_seed(secret_seed())
        for n in shared:
            r = ref_params[n]
            rf = r.detach().float()
            spread = float(rf.std().item()) if r.numel() > 1 else 0.0
            if not spread or spread != spread:
                spread = max(abs(float(rf.mean().item())), 1.0)
            new = rf + 0.5 * spread * torch.randn(r.shape, generator=g, device=r.device)
            r.data.copy_(new.to(r.dtype))
            cand_params[n].data.copy_(r.data)
        xs = self.make_inputs(secret_seed())
        ref_out = self.ref(*clone_inputs(xs))
        if not all(bool(torch.isfinite(t).all().item()) for t in leaves(ref_out) or [] if t.is_floating_point()):
            return
        self.alive.append(ref_out)
        args = clone_inputs(xs)
        out = self.cand_run(args, ref_out)
        chk = self.check(index, "perturbed", ref_out, out, args, xs, xs)
        others = [s for s in v.sets if s.kind != "perturbed"]
        if not chk.passed and all(s.passed for s in others):
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
            ref_moved = not all(_same(a, b) for a, b in zip(leaves(ref_m) or [], leaves(ref_a) or []))
            cand_still = all(_same(a, b) for a, b in zip(leaves(out_m) or [], leaves(out_a) or []))
            if ref_moved and cand_still:
                self.v.findings.append(Finding(
                    code=FindingCode.ignores_inputs,
                    message=f"the output does not change when input {i} changes (the reference's does): input {i} is ignored",
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
        runs = timer.runs_for(self.cand, self._gen(None), quick, v.options.timed_runs)
        cand = Series(self.cand, self._gen(refs), runs, warm, check)
        return time_with_reference(timer, cand, self.ref, self._gen(None), base, quick)

    def timings(self, stats: RunStats, eager: RunStats | None, base: Baseline | None) -> Timings:
        """Candidate timings against eager and torch.compile (`timing.timings_against`) and the
        roofline bound. Without a cached baseline, `eager` (timed in this verdict) is the new eager
        figure; torch.compile is measured here, and both are cached (not for quick runs)."""
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
                    compile_note = f"torch.compile failed: {type(exc).__name__}: {str(exc)[:300]}"
            base = Baseline(problem_hash=v.problem.hash, device=env.device, torch_version=env.torch_version,
                            eager_ms=eager.median_ms, eager_runs=len(eager.gpu_ms),
                            eager_issue_ms=eager.issue_median_ms, compile_ms=compile_ms,
                            compile_runs=compile_runs, compile_note=compile_note)
            if not quick:
                env.baselines.put(base)
        bw = dram_bandwidth(env.props)
        bound = roofline_ms(self.io_bytes, self.flops, bw, peak_flops(env.device, self.dtype))
        return timings_against(stats, eager, base, cached, want_compile=want_compile, quick=quick, bound_ms=bound)


def _max(values: Any) -> float | None:
    vals = [x for x in values if x is not None]
    return max(vals) if vals else None


# ---------------------------------------------------------------------------------------------
# Compile-only


_GPU_HINTS = ("cuda", "nvidia", "gpu", "nvrtc", "driver")


def compile_only_verification(env: WorkerEnv, problem: Problem, source: str, options: VerifyOptions,
                              candidate_id: str, report: Callable[[str], None]) -> VerifyResult:
    """Imports the candidate with its builders intercepted and compiles what it builds with nvcc."""
    t0 = time.perf_counter()
    report("static")
    findings = check_source(source, options.allow)
    report("import")
    error: BaseException | None = None
    problem_error = ""
    names = [f"kbmcp_problem_{next(env.counter)}", f"kbmcp_candidate_{next(env.counter)}"]
    with capture_units() as captured:
        init: list[Any] | None = None
        try:  # the problem first: what fails before candidate code runs is the problem's error
            pmod = load_module(problem.source, names[0], env.workdir)
            init = list(pmod.get_init_inputs())
        except NeedsGPU:
            pass
        except Exception as exc:
            problem_error = f"its module failed to import: {short_traceback(exc, ())}"
        try:
            if not problem_error:
                cmod = load_module(source, names[1], env.workdir)
                model_new = getattr(cmod, "ModelNew", None)
                if isinstance(model_new, type) and init is not None:
                    model_new(*init)
        except NeedsGPU:
            pass
        except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything
            error = exc
    for name in names:
        sys.modules.pop(name, None)
    if problem_error:
        return VerifyResult(candidate_id=candidate_id, problem=problem.name, problem_hash=problem.hash,
                            verdict=Verdict.crashed, summary=f"the problem failed: {problem_error}",
                            compile=CompileResult(ok=True), phase="import", problem_error=problem_error,
                            torch_version=env.torch_version, elapsed_s=round(time.perf_counter() - t0, 3))
    report("compile")
    units = all_units(captured, static_units(source))
    arch = options.arch or env.arch or DEFAULT_ARCH
    comp = compile_only(units, arch, env.cache_dir, options.compile_timeout_s)
    base = dict(candidate_id=candidate_id, problem=problem.name, problem_hash=problem.hash, compile=comp,
                findings=findings, device="", arch=comp.arch, torch_version=env.torch_version, phase="compile")
    if isinstance(error, SyntaxError) and comp.ok:
        return VerifyResult(verdict=Verdict.compile_error, summary=f"compile error: Python syntax error at line "
                            f"{error.lineno}: {error.msg}", elapsed_s=round(time.perf_counter() - t0, 3), **base)
    if error is not None and comp.ok and not any(h in str(error).lower() for h in _GPU_HINTS):
        text = short_traceback(error, (str(env.workdir / f"{names[1]}.py"),))
        return VerifyResult(verdict=Verdict.crashed, summary=f"crashed: importing or constructing the candidate raised {text}",
                            elapsed_s=round(time.perf_counter() - t0, 3), **base)
    verdict, flagged, summary = decide(comp, [], findings, None, gpu=False)
    return VerifyResult(verdict=verdict, summary=summary, flagged=flagged, elapsed_s=round(time.perf_counter() - t0, 3), **base)
