"""A cheap, import-free look at whether CUDA can possibly see a GPU here.

Tools that need a GPU ask this before starting a process that imports torch (seconds): where it
says there is certainly none, they answer `needs_gpu` at once. It only rules GPUs out; where it
cannot, the real check happens in the process that would use the GPU.
"""

from __future__ import annotations

import glob
import os
import sys

ENV_VISIBLE = "CUDA_VISIBLE_DEVICES"


def no_gpu_reason() -> str | None:
    """Why no CUDA GPU can be visible to a process started from here, or None when one may be."""
    if sys.platform not in ("linux", "win32"):
        return f"CUDA GPUs are not supported on this operating system ({sys.platform})"
    visible = os.environ.get(ENV_VISIBLE)
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return f"{ENV_VISIBLE}={visible!r} hides every GPU from this process"
    if sys.platform == "linux" and not _linux_gpu_device_nodes():
        return ("no NVIDIA GPU on this machine (no /dev/nvidia* device; is the NVIDIA driver installed and the GPU "
                "passed into this container?)")
    return None


def _linux_gpu_device_nodes() -> list[str]:
    # /dev/nvidia0.. for native drivers (containers get them mounted); /dev/dxg under WSL2.
    return [p for p in glob.glob("/dev/nvidia[0-9]*") if p[len("/dev/nvidia") :].isdigit()] + glob.glob("/dev/dxg")
