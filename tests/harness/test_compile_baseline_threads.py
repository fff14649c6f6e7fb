"""The torch.compile baseline must leave no thread behind that the thread census would blame on a candidate."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import threading, time, torch
    from kb_mcp.harness.worker.main import compile_baseline_in_process
    if {pin}:
        compile_baseline_in_process()
    before = set(threading.enumerate())
    f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
    f(torch.randn(64)); f(torch.randn(64))
    # a model of several kernels: inductor waits for them under its progress bar (tqdm's monitor thread)
    m = torch.compile(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    m(torch.randn(4, 64)); m(torch.randn(4, 64))
    time.sleep(0.5)
    print(sorted(t.name for t in threading.enumerate() if t not in before and t.is_alive()))
    """
)


def _new_threads(pin: bool) -> list[str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(pin=pin)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_in_process_compile_starts_no_thread() -> None:
    assert _new_threads(pin=True) == []


def test_the_progress_bar_is_there_to_be_seen() -> None:
    """tqdm is installed with the dev extra, so the test above meets torch.compile's progress bar."""
    import tqdm

    assert tqdm.tqdm.monitor_interval >= 0
    assert "tqdm_monitor" in _new_threads(pin=False)  # unpinned, the monitor thread is what retired workers
