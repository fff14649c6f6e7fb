"""Integrity checks: what the harness does so that a candidate cannot pass by cheating.

Static checks (`check_source`) read the candidate's syntax tree and need no torch; runtime guards
(`IntegrityGuard`) run in the worker process around candidate code. Both return `Finding`s with the
codes of `harness.judgment.verdict.FindingCode`; every finding says what was seen and what to change.

How the core uses it, in a worker (torch and CUDA initialised, no candidate imported yet)::

    pristine = TrustedSnapshot.capture()            # once per worker, after the harness's own hooks
                                                    # (builders) are installed, before any candidate

    guard = IntegrityGuard(allow=options_allow, trusted=pristine)   # per candidate
    findings = guard.check_source(source)           # static evidence (also usable server-side)
    with guard.watch_setup():                       # import + constructor: threads, tampering
        module = load_module(source, name, directory)
        model = module.ModelNew(*init_inputs)
    findings += guard.attach(module, model, reference=problem_module.Model)
    with guard.watch():                             # around each checked candidate forward
        out = model(*inputs)
    census = guard.census(lambda: model(*inputs))   # once (GPU): which kernels ran, and whose
    ...timing, using guard.trusted.* (timer, events, synchronize) captured before the import...
    findings += guard.findings()                    # ops, threads, trusted functions, settings, L2, census
    if guard.retire_worker(findings): replace the worker process

What each piece catches:

* `watch()` records every ATen op the forward executes (TorchDispatchMode) and reports PyTorch
  compute ops as `library_call`, naming the candidate line; allocation, views, shape queries and
  the candidate's own registered ops are allowed. It also reports threads still running after
  forward returns (`background_thread`) and removal of the guard itself (`harness_tampering`).
* `census()` runs one forward under the profiler: kernels launched outside any PyTorch op are the
  candidate's own (`KernelCensus.own`); none of them means `no_custom_kernel`; cuBLAS/cuDNN kernels
  or kernels of PyTorch ops reached from compiled code mean `library_call`.
* `findings()` compares the trusted functions (time.*, torch.cuda.Event/synchronize, allclose,
  Tensor and Module methods, the harness's own modules) with the pristine snapshot and the global
  numerics flags (TF32, matmul precision, default dtype) with their original values, and reads the
  L2 persisting set-aside and access-policy window through the CUDA driver (`l2_persistence`).

The allow-list (`allow`) takes group names (`gemm`: matmul/linear and cuBLAS; `conv`: convolutions
and cuDNN) or op names in any spelling (`torch.matmul`, `aten::mm`, `F.linear`); the same list
governs static and runtime checks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kb_mcp.harness.judgment.integrity_static import ALLOW_GROUPS, check_source, expand_allow
from kb_mcp.harness.judgment.verdict import Finding, FindingCode

if TYPE_CHECKING:  # torch-side types; this module imports torch only when a guard is built
    from kb_mcp.harness.worker.integrity_runtime import KernelCensus, Trusted, TrustedSnapshot

__all__ = [
    "ALLOW_GROUPS",
    "IntegrityGuard",
    "RETIRE_WORKER",
    "check_source",
    "dedupe",
    "expand_allow",
]

# Findings after which the worker process must not run another candidate: its interpreter or
# device state may still carry the candidate's changes.
RETIRE_WORKER = frozenset(
    {FindingCode.harness_tampering, FindingCode.background_thread, FindingCode.l2_persistence,
     FindingCode.forged_result, FindingCode.precision_lowered, FindingCode.tf32_switch,
     FindingCode.cudnn_benchmark}
)


def dedupe(findings: Iterable[Finding]) -> list[Finding]:
    """Findings without repeats (same code, source, line and message), in first-seen order."""
    seen: set[tuple[str, str, int | None, str]] = set()
    out: list[Finding] = []
    for f in findings:
        key = (f.code.value, f.source, f.line, f.message)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


class IntegrityGuard:
    """Runtime integrity checks for one candidate in one worker process (see the module docstring)."""

    def __init__(self, allow: Collection[str] = (), trusted: TrustedSnapshot | None = None,
                 composed: bool = False) -> None:
        from kb_mcp.harness.worker import integrity_runtime as rt

        self._rt = rt
        self.allow_raw = tuple(allow)
        self.allow = rt.expand_runtime_allow(allow)
        self.composed = composed  # composed mode: the reference's own ops are allowed too (`compose`)
        self.kept_kernels: frozenset[str] = frozenset()  # their packets at the census's level
        self.snapshot = trusted if trusted is not None else rt.TrustedSnapshot.capture()
        self.candidate_file: str | None = None
        self.recorder = rt.OpRecorder(self.allow)
        self.last_census: KernelCensus | None = None
        self._collected: list[Finding] = []
        import torch

        self._cuda = torch.cuda.is_available()
        if self._cuda:
            # A clean L2 state before the candidate, so whatever is found afterwards is its doing.
            rt.reset_l2_persistence()

    @property
    def trusted(self) -> Trusted:
        """Timer, event, synchronize and comparison functions as they were before any candidate."""
        return self.snapshot.trusted

    def check_source(self, source: str) -> list[Finding]:
        """Static findings on the candidate's source with this guard's allow-list (and mode)."""
        return check_source(source, self.allow_raw, composed=self.composed)

    def compose(self, dispatch: Collection[str], kernels: Collection[str] | None) -> None:
        """Composed mode: the reference's own ops (`harness.judgment.composed`), at the op recorder's level
        (`dispatch`) and at the census's (`kernels`; None where the census could not record them:
        then the dispatch-level set stands in, by packet name), are allowed from now on."""
        from kb_mcp.harness.judgment.composed import kept_packets

        self.recorder.kept = frozenset(dispatch)
        self.kept_kernels = kept_packets(kernels if kernels is not None else dispatch)

    def take_census(self, census: KernelCensus, kernels: Collection[str] | None = None) -> KernelCensus:
        """Keeps a census taken elsewhere (the census worker's), sorted with this guard's allowance:
        in composed mode the kernels of the reference's own ops (`kernels`, the census worker's record
        of them; None: the dispatch-level set stands in) are not library calls."""
        if self.composed:
            self.compose(self.recorder.kept, kernels)
            census = self._rt.reclassify(census, self.allow | self.kept_kernels)
        self.last_census = census
        return census

    @contextmanager
    def watch_setup(self) -> Iterator[None]:
        """Wraps the candidate's import and constructor: PyTorch ops are allowed there, threads are not."""
        before = self._rt.ThreadCensus.take()
        try:
            yield
        finally:
            self._collected += self._rt.thread_findings(before, self._rt.ThreadCensus.take(), "import and construction")

    def attach(self, module: ModuleType, model: Any = None, reference: type | None = None) -> list[Finding]:
        """Notes the candidate's file (for line numbers) and checks ModelNew against the reference Model."""
        self.candidate_file = getattr(module, "__file__", None)
        self.recorder.candidate_file = self.candidate_file
        findings: list[Finding] = []
        model_new = getattr(module, "ModelNew", None)
        if isinstance(model_new, type):
            findings += self._rt.check_model_class(model_new, reference)
        if model is not None:
            findings += self._rt.check_model_instance(model, reference)
        return findings

    @contextmanager
    def watch(self) -> Iterator[None]:
        """Wraps one candidate forward: records PyTorch ops, then checks threads and the guard itself."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        before = self._rt.ThreadCensus.take()
        removed = False
        try:
            with self.recorder:
                try:
                    yield
                finally:
                    removed = _get_current_dispatch_mode() is not self.recorder
        finally:
            self._collected += self._rt.thread_findings(before, self._rt.ThreadCensus.take(), "forward")
            if removed:
                self._collected.append(
                    Finding(
                        code=FindingCode.harness_tampering,
                        message=(
                            "the harness's op recorder was no longer active when forward returned; the "
                            "candidate disabled or replaced PyTorch dispatch modes"
                        ),
                        source="runtime",
                    )
                )

    def census(self, call: Callable[[], Any]) -> KernelCensus:
        """Runs `call` (one forward) under the profiler and sorts the kernels it launched."""
        self.last_census = self._rt.census(call, self.allow | self.kept_kernels)
        return self.last_census

    def findings(self) -> list[Finding]:
        """All runtime findings so far: ops, threads, trusted functions, settings, L2 state, census."""
        found = list(self._collected)
        found += self.recorder.findings()
        found += self.snapshot.verify()
        if self._cuda:
            found += self._rt.l2_findings(self._rt.l2_state())
        if self.last_census is not None:
            # The recorder already names PyTorch ops issued from Python, with lines; then the census
            # adds only what it alone can see (vendor kernels, no kernel of the candidate's own).
            found += self._rt.census_findings(self.last_census, include_torch_ops=not self.recorder.banned())
        return dedupe(found)

    @staticmethod
    def retire_worker(findings: Iterable[Finding]) -> bool:
        """True if the worker that ran this candidate must be replaced before the next one."""
        return any(f.code in RETIRE_WORKER for f in findings)
