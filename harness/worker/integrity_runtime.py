"""Runtime integrity guards, run inside the worker process around candidate code.

* `OpRecorder`: a TorchDispatchMode that records every ATen op a watched call executes, with the
  candidate's source line, and classifies it as allowed (allocation, views, shape queries, the
  candidate's own custom ops) or a library compute op. Works on CPU tensors as on CUDA ones.
* `TrustedSnapshot`: the identity of every function and class the harness trusts (timers, CUDA
  events, synchronize, comparison functions, Tensor methods, the harness's own modules) and the
  global numerics settings, captured before any candidate is imported and verified after.
* `ThreadCensus`: Python and native threads before and after a call; a thread a candidate leaves
  running is a finding.
* `l2_state` / `reset_l2_persistence`: the L2 persisting set-aside and the current stream's
  access-policy window, read through the CUDA driver.
* `census`: runs one call under the PyTorch profiler and lists the GPU kernels it launched, each
  with the ATen op (if any) that launched it, so the core can tell the candidate's own kernels
  from library kernels (`no_custom_kernel`, `library_call`). Only the census worker runs it: a
  process that times candidates calls `forbid_profiler()` and never starts a profiler session.

Each lives in a module of its own (`ops`, `trusted`, `threads`, `l2`, `profiling`; the census's
models in `harness.judgment.kernels`); this module gathers them, and `harness.worker.integrity.IntegrityGuard`
combines them into a few calls (see its docstring).
"""

from __future__ import annotations

from kb_mcp.harness.judgment.kernels import (
    ALLOWED_OPS,
    NOOP_ONLY_OPS,
    TORCH_NAMESPACES,
    KernelCensus,
    KernelLaunch,
    census_findings,
    classify_launches,
    expand_runtime_allow,
    reclassify,
)
from kb_mcp.harness.worker.l2 import L2State, l2_findings, l2_state, reset_l2_persistence
from kb_mcp.harness.worker.ops import OpEvent, OpRecorder, check_model_class, check_model_instance, record_ops
from kb_mcp.harness.worker.profiling import (
    ANNOTATION,
    ProfilerEvent,
    ProfilerForbidden,
    census,
    forbid_profiler,
    launches_from_events,
    profile_events,
    profiler_sessions,
    record_launches,
)
from kb_mcp.harness.worker.threads import ThreadCensus, thread_findings
from kb_mcp.harness.worker.trusted import Trusted, TrustedSnapshot

__all__ = [
    "ALLOWED_OPS", "ANNOTATION", "NOOP_ONLY_OPS", "TORCH_NAMESPACES", "KernelCensus", "KernelLaunch", "L2State",
    "OpEvent", "OpRecorder", "ProfilerEvent", "ProfilerForbidden", "ThreadCensus", "Trusted", "TrustedSnapshot",
    "census", "census_findings", "check_model_class", "check_model_instance", "classify_launches",
    "expand_runtime_allow", "forbid_profiler", "l2_findings", "l2_state", "launches_from_events", "profile_events",
    "profiler_sessions", "reclassify", "record_launches", "record_ops", "reset_l2_persistence", "thread_findings",
]
