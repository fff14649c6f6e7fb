"""The kernel census, run in a worker process of its own so that timing workers never profile.

The census (`integrity_runtime.census`: which GPU kernels one forward launches, and whose) needs a
profiler session, and after a profiler session CUPTI can keep the host cost of every launch
raised for the rest of the process (`integrity_runtime.forbid_profiler` says by how much). A
worker that times candidates and baselines therefore never starts one. The pool keeps a census
worker (the same program, `--role census`, its first profiler session paid at start) and asks it
once per candidate: after the candidate has passed every check in the timing worker, and before
it is timed there. The timing worker waits for the answer, so the census never overlaps a timed
run.

In the census worker the candidate is imported (its builds come from the shared content-hashed
cache), ModelNew is constructed, forward runs once (lazy builds and first-call set-up happen
there) and then once under the profiler. The answer is the census plus the census worker's own
integrity findings (trusted functions replaced, threads left running, L2 persistence); the census
worker retires after any of them or after the candidate raised. The kernel findings proper
(`library_call`, `no_custom_kernel`) are drawn from the census by the timing worker, with the
candidate's allow-list, as `IntegrityGuard.findings` always did.

`protocol.CensusReply` is plain pydantic (no torch): the pool reads it and passes it on.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from kb_mcp.harness.problem import Problem
from kb_mcp.harness.protocol import CensusReply, ProblemFailed
from kb_mcp.harness.verdict import Finding, VerifyOptions
from kb_mcp.harness.worker import integrity_runtime as rt
from kb_mcp.harness.worker.loading import load_module, short_traceback
from kb_mcp.harness.worker.values import clone_inputs, secret_seed
from kb_mcp.kb.models import Verdict


def run_census(env: Any, problem: Problem, source: str, options: VerifyOptions,
               report: Callable[[str], None]) -> tuple[CensusReply | ProblemFailed, bool]:
    """Census of one candidate's forward (census worker side); returns (reply, retire_worker).

    `env` is the census worker's `verify.WorkerEnv`. Without CUDA the forward still runs (on CPU
    tensors), and the census says it saw no GPU. A problem that fails to import is the problem's
    failure (ProblemFailed), not the candidate's.
    """
    t0 = time.perf_counter()
    device = "cuda" if env.cuda else "cpu"
    if env.builders is not None:
        env.builders.reset()
    names: list[str] = []
    files: tuple[str, ...] = ()
    before = rt.ThreadCensus.take()
    census: Any = None
    threads: list[Finding] | None = None
    verdict: Verdict | None = None
    summary = ""
    where = "importing the candidate"

    def load(text: str, stem: str) -> Any:
        name = f"{stem}_{next(env.counter)}"
        names.append(name)
        return load_module(text, name, env.workdir)

    def sync() -> None:
        if env.cuda:
            env.snapshot.trusted.synchronize()

    if env.cuda:
        # A clean L2 state first, so that whatever is found afterwards is the candidate's doing: a
        # census worker that never reset it reported a persisting set-aside of 9830400 bytes on an
        # H100 (driver 580) before any candidate could have set one.
        rt.reset_l2_persistence()
    report("import")
    try:
        pmod = load(problem.source, "kbmcp_census_problem")
    except Exception as exc:  # noqa: BLE001 - the problem's own failure: no candidate code has run yet
        sys.modules.pop(names[-1], None)
        return ProblemFailed(stage="import", error=short_traceback(exc, (str(env.workdir / f"{names[-1]}.py"),))), True
    try:
        cmod = load(source, "kbmcp_census_candidate")
        files = (str(getattr(cmod, "__file__", "")),)
        report("construct")
        where = "constructing ModelNew"
        init = [x.to(device) if isinstance(x, torch.Tensor) else x for x in pmod.get_init_inputs()]
        torch.manual_seed(secret_seed())
        model = cmod.ModelNew(*init).to(device).eval()
        torch.manual_seed(secret_seed())
        with torch.device(device):
            xs = list(pmod.get_inputs())
        xs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]
        torch.manual_seed(secret_seed())
        report("census")
        where = "ModelNew.forward"
        with torch.no_grad():
            model(*clone_inputs(xs))  # first call: lazy builds and one-time set-up, as in the checks
            sync()
            # Threads are counted up to here: a profiler session may start threads of its own.
            threads = rt.thread_findings(before, rt.ThreadCensus.take(), "import, construction and forward")
            args = clone_inputs(xs)
            if env.cuda:
                census = rt.census(lambda: model(*args), rt.expand_runtime_allow(options.allow))
            else:  # the same call, with nothing for a profiler to see
                model(*args)
                census = rt.census(lambda: None)
            sync()
    except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything, exits included
        verdict = Verdict.crashed
        summary = (f"crashed: {where} raised {short_traceback(exc, files)} in the census worker (where one forward "
                   "runs under the profiler, in a process of its own), although it passed the checks")
    findings: list[Finding] = []
    if threads is None:
        threads = rt.thread_findings(before, rt.ThreadCensus.take(), "import, construction and forward")
    findings += threads
    findings += env.snapshot.verify()
    if env.cuda:
        try:
            findings += rt.l2_findings(rt.l2_state())
            rt.reset_l2_persistence()
        except Exception:  # noqa: BLE001 - a broken context: retire below
            verdict = verdict or Verdict.crashed
            summary = summary or "crashed: the CUDA context of the census worker broke during the census"
    for name in names:
        sys.modules.pop(name, None)
    gc.collect()
    if env.cuda:
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            verdict = verdict or Verdict.crashed
    reply = CensusReply(
        census=census.model_dump(mode="json") if census is not None else None,
        findings=findings, verdict=verdict, summary=summary, pid=os.getpid(),
        elapsed_s=round(time.perf_counter() - t0, 3),
    )
    return reply, not reply.clean
