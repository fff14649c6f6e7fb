"""Running the worker side of a decomposition (`kb_mcp.harness.worker.decompose_trace`) in the
sandbox: a problem is untrusted code, and tracing it runs it. One request may carry several
problems; `jobs` processes split them between them. Each problem has a time limit of its own in each
step (`limits.TIME_LIMIT_S` by default): one that runs past it is stopped and said to be the cause, and
the problems after it run in a fresh process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kb_mcp.decomposition.limits import TIME_LIMIT_S
from kb_mcp.harness.sandbox.sandbox import Grant, Sandbox, detect
from kb_mcp.harness.sandbox.scratch import new_scratch
from kb_mcp.harness.sandbox.waiting import wait_for

WORKER = "kb_mcp.harness.worker.decompose_trace"
STEPS = {"trace": "traced", "split": "split into its parts", "check": "checked against its recomposition"}


class WorkerFailed(RuntimeError):
    """The decomposition worker died or answered nothing (environment's or problem's fault; output attached)."""


def run(action: str, entries: list[dict[str, Any]], sandbox: Sandbox | None = None, timeout_s: float = TIME_LIMIT_S,
        jobs: int = 1, costs: list[float] | None = None) -> list[dict[str, Any]]:
    """One result per entry (`{"ok": ...}`), in order; entries are split over `jobs` sandboxed processes,
    by their `costs` where known (a model's graph size: one unrolled RNN outweighs ten small nets).
    `timeout_s` is each entry's own limit; an entry that ran past it answers `{"ok": false,
    "timed_out": timeout_s, "error": ...}`."""
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
    """The entries' answers from one worker process, and from a fresh one for those after an entry
    that ran past its limit (it is stopped with its process, and the rest still get their turn)."""
    results: list[dict[str, Any]] = []
    while len(results) < len(entries):
        answers, code, output, stopped = _process(box, action, entries[len(results):], timeout_s)
        results += answers[: len(entries) - len(results)]
        if len(results) == len(entries):
            break
        if stopped:
            results.append(timed_out(action, timeout_s))
            continue
        why = f"the decomposition worker stopped (exit {code}) after {len(results)} of {len(entries)}: " \
              f"{output.strip()[-1500:]}"
        results += [{"ok": False, "error": why}] * (len(entries) - len(results))
    return results


def timed_out(action: str, timeout_s: float) -> dict[str, Any]:
    """The answer for a problem whose own code ran past its time limit in the sandbox."""
    why = (f"the problem's own code (its file's top level, its Model's construction or its forward, run while "
           f"it is {STEPS[action]} in the sandbox) ran past the time limit of {timeout_s:g} s and was stopped")
    return {"ok": False, "timed_out": timeout_s, "error": why}


def _process(box: Sandbox, action: str, entries: list[dict[str, Any]],
             timeout_s: float) -> tuple[list[dict[str, Any]], int, str, bool]:
    """One worker process over `entries`: (its answers, exit code, output, whether it was stopped
    because an entry ran past its limit)."""
    scratch = new_scratch("decompose")
    try:
        (scratch / "request.json").write_text(json.dumps({"action": action, "problems": entries}))
        argv = [sys.executable, "-m", WORKER, str(scratch / "request.json"), str(scratch / "result.json")]
        proc = box.popen(argv, Grant(role="tool", scratch=scratch), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        code, output, stopped = _wait(proc, scratch / "result.json", timeout_s)
        return _answers(scratch / "result.json"), code, output, stopped
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _wait(proc: subprocess.Popen[str], result: Path, timeout_s: float) -> tuple[int, str, bool]:
    """Waits for the worker: (exit code, output, whether it was stopped). Each entry has `timeout_s`
    from the answer before it (the first from the worker's start, its imports included): the worker
    writes its answers as it goes, so a slow entry is not charged for the ones before it."""
    answered, seen = 0, (-1, -1)

    def answered_another() -> bool:
        nonlocal answered, seen
        stamp = _stamp(result)
        if stamp == seen:  # read again only when the worker wrote (an answer can be large)
            return False
        seen, now = stamp, len(_answers(result))
        another, answered = now > answered, max(now, answered)
        return another

    ended = wait_for(proc, timeout_s, restart=answered_another)
    return ended.code, ended.output, ended.timed_out


def _stamp(path: Path) -> tuple[int, int]:
    """When the file was last written, and its size (a rewrite within one clock tick changes the size)."""
    try:
        stat = path.stat()
    except OSError:
        return -1, -1
    return stat.st_mtime_ns, stat.st_size


def _answers(path: Path) -> list[dict[str, Any]]:
    """The answers the worker wrote so far (none where it wrote none, or is writing them now)."""
    try:
        answers = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return answers if isinstance(answers, list) else []
