"""Whether the process that owns something (a KB lock, a job, a scratch folder, a waiting profiling
driver) still runs. Plain standard library, so that anything may import it at no start-up cost."""

from __future__ import annotations

import os

__all__ = ["process_alive"]


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine (as this process sees it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's: cannot be ours, yet not gone either
        return True
    return True
