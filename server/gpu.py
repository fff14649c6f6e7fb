"""A cheap look for an NVIDIA GPU, for the start-up banner and the server's instructions.

It asks `nvidia-smi` rather than importing torch: a stdio server must answer its client's
handshake quickly, and importing torch costs seconds. The tools that need a GPU find out
for themselves (in their worker processes) and say so in their results.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Sequence


@functools.lru_cache(maxsize=1)
def detect_gpus() -> list[str]:
    """Names of the visible NVIDIA GPUs (empty when there is none or no driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def gpu_summary(gpu_tools: Sequence[str]) -> str:
    """One line for people and agents: which GPU this server sees, or what works without one.

    `gpu_tools` are the tools that time or profile (those whose `ToolMeta.uses_gpu` is set)."""
    gpus = detect_gpus()
    if gpus:
        return f"GPU: {', '.join(gpus)}"
    return (
        "GPU: none found on this machine. The KB tools work; "
        f"{' and '.join(gpu_tools) or 'the GPU tools'} compile and check what they can and report that timing and "
        "profiling need a GPU (verdict needs_gpu)."
    )
