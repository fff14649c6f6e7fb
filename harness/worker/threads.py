"""Threads a candidate leaves running (worker side): Python and native threads before and after a call."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kb_mcp.harness.judgment.verdict import Finding, FindingCode
from kb_mcp.harness.worker.trusted import describe

# Native threads the CUDA driver and runtime start on their own (event handler, JIT, ...).
DRIVER_THREAD_PREFIXES: tuple[str, ...] = ("cuda", "nvrtc", "nvjitlink", "cupti", "pt_", "torch", "ncu")


def _native_threads() -> dict[int, str]:
    out: dict[int, str] = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                out[int(tid)] = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            except OSError:
                continue
    except OSError:  # pragma: no cover - not Linux
        pass
    return out


@dataclass(frozen=True)
class ThreadCensus:
    """The Python and native threads alive at one moment."""

    python: frozenset[threading.Thread]
    native: dict[int, str]

    @classmethod
    def take(cls) -> ThreadCensus:
        """Census of the current process."""
        return cls(frozenset(threading.enumerate()), _native_threads())

    def new_since(self, earlier: ThreadCensus) -> tuple[list[threading.Thread], dict[int, str]]:
        """Threads alive now that were not alive at `earlier` (Python threads, other native ones)."""
        py = [t for t in self.python if t not in earlier.python and t.is_alive()]
        py_native = {t.native_id for t in py}
        native = {
            tid: name
            for tid, name in self.native.items()
            if tid not in earlier.native
            and tid not in py_native
            and not name.lower().startswith(DRIVER_THREAD_PREFIXES)
        }
        return py, native


def thread_findings(before: ThreadCensus, after: ThreadCensus, phase: str) -> list[Finding]:
    """`background_thread` findings for threads started during `phase` and still running after it."""
    py, native = after.new_since(before)
    for _ in range(10):
        # A thread that was joined can linger in /proc for a moment while the OS reaps it.
        if not native:
            break
        time.sleep(0.005)
        py, native = ThreadCensus.take().new_since(before)
    findings: list[Finding] = []
    if py:
        names = ", ".join(sorted(f"{t.name} (target {describe(getattr(t, '_target', None) or t.run)})" for t in py))
        findings.append(
            Finding(
                code=FindingCode.background_thread,
                message=(
                    f"{len(py)} Python thread(s) started during {phase} were still running after it "
                    f"returned: {names}. Work in a background thread escapes the timer; do it inside forward"
                ),
                source="runtime",
            )
        )
    if native:
        findings.append(
            Finding(
                code=FindingCode.background_thread,
                message=(
                    f"{len(native)} native thread(s) started during {phase} were still running after it "
                    f"returned ({', '.join(sorted(set(native.values())))}). Work in a background thread "
                    "escapes the timer; do it inside forward"
                ),
                source="runtime",
            )
        )
    return findings
