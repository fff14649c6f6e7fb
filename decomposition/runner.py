"""Running the worker side of a decomposition (`kb_mcp.harness.worker.decompose_trace`) in the
sandbox: a problem is untrusted code, and tracing it runs it. One request may carry several
problems; `jobs` processes split them between them."""

from __future__ import annotations

import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kb_mcp.harness.sandbox.sandbox import Grant, Sandbox, detect
from kb_mcp.harness.sandbox.scratch import new_scratch

WORKER = "kb_mcp.harness.worker.decompose_trace"


class WorkerFailed(RuntimeError):
    """The decomposition worker died or answered nothing (environment's or problem's fault; output attached)."""


def run(action: str, entries: list[dict[str, Any]], sandbox: Sandbox | None = None, timeout_s: float = 900.0,
        jobs: int = 1, costs: list[float] | None = None) -> list[dict[str, Any]]:
    """One result per entry (`{"ok": ...}`), in order; entries are split over `jobs` sandboxed processes,
    by their `costs` where known (a model's graph size: one unrolled RNN outweighs ten small nets)."""
    box = sandbox or detect()
    jobs = max(1, min(jobs, len(entries)))
    shares = split(costs, jobs) if costs is not None else [list(range(j, len(entries), jobs)) for j in range(jobs)]
    with ThreadPoolExecutor(jobs) as pool:
        answers = list(pool.map(lambda idx: _one(box, action, [entries[i] for i in idx], timeout_s), shares))
    out: list[dict[str, Any]] = [{} for _ in entries]
    for idx, answer in zip(shares, answers):
        for i, result in zip(idx, answer):
            out[i] = result
    return out


def split(costs: list[float], jobs: int) -> list[list[int]]:
    """Entry indices for each of `jobs` processes, the largest cost first to the least loaded (each
    process's entries in their given order), so that no process is left running long after the others."""
    loads = [0.0] * jobs
    shares: list[list[int]] = [[] for _ in range(jobs)]
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        j = loads.index(min(loads))
        shares[j].append(i)
        loads[j] += costs[i]
    return [sorted(share) for share in shares if share]


def _one(box: Sandbox, action: str, entries: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
    scratch = new_scratch("decompose")
    try:
        (scratch / "request.json").write_text(json.dumps({"action": action, "problems": entries}))
        argv = [sys.executable, "-m", WORKER, str(scratch / "request.json"), str(scratch / "result.json")]
        code, output = box.run(argv, Grant(role="tool", scratch=scratch), timeout_s=timeout_s)
        try:
            results: list[dict[str, Any]] = json.loads((scratch / "result.json").read_text())
        except (OSError, ValueError):
            results = []
        if len(results) < len(entries):
            why = f"the decomposition worker stopped (exit {code}) after {len(results)} of {len(entries)}: " \
                  f"{output.strip()[-1500:]}"
            results += [{"ok": False, "error": why}] * (len(entries) - len(results))
        return results
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
