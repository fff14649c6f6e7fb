"""Which GPU a process started from here measures on, named the same way by every process of the
machine: the key of its GPU lane (`harness.gpu.lane`).

The harness's workers, census worker and profiling drivers use CUDA device 0 of what
`CUDA_VISIBLE_DEVICES` leaves visible, so the key is that GPU's UUID, read from `nvidia-smi
--query-gpu=index,uuid` (no torch: seconds saved, and this side never imports it). The variable may
name GPUs by index (`1,0`), by UUID or a unique UUID prefix (`GPU-8f3c...`), or a MIG instance
(`MIG-...`, its own key). Indices are read in nvidia-smi's order, the PCI bus order: CUDA's own
order is that too where `CUDA_DEVICE_ORDER=PCI_BUS_ID` or where the GPUs are all of one model;
on a machine with different models, set `CUDA_DEVICE_ORDER=PCI_BUS_ID` (or name GPUs by UUID) so
that index 0 means the same GPU to both.

Where no GPU can be visible (`gpu_probe.no_gpu_reason`) there is no key: nothing measures, and the
lane is this process's own. Where a GPU may be visible but nvidia-smi cannot say which (not
installed, failing), the key falls back to what the variable names (`index-1`, or the UUID as
given), `index-0` when it is unset: every process that cannot run nvidia-smi then agrees with every
other that cannot, but not with one that can (which keys by UUID). The key says which it is.

`KB_MCP_LANE_KEY` names the key outright (any short name, e.g. `cpu-lane-test`): the machine-wide
lane is then taken even without a GPU, which is how its tests run on CPU machines, and processes
that see one GPU under names nvidia-smi cannot resolve can be made to take turns.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
from typing import Literal

from pydantic import BaseModel, ConfigDict

from kb_mcp.harness.gpu.gpu_probe import ENV_VISIBLE, no_gpu_reason

__all__ = ["ENV_LANE_KEY", "GpuKey", "SmiGpu", "gpu_key", "parse_smi", "resolve_key", "safe_key"]

log = logging.getLogger(__name__)

ENV_LANE_KEY = "KB_MCP_LANE_KEY"
_KEY_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_KEY = 80


class SmiGpu(BaseModel):
    """One GPU as nvidia-smi lists it."""

    model_config = ConfigDict(frozen=True)

    index: int
    uuid: str
    name: str = ""


class GpuKey(BaseModel):
    """The key of the GPU lane: which GPU, and how it was found."""

    model_config = ConfigDict(frozen=True)

    key: str  # the GPU's UUID, a MIG instance's, or a fallback or explicit name (file-name safe)
    source: Literal["uuid", "mig", "fallback", "explicit"]
    note: str = ""  # for a fallback: why nvidia-smi's UUID is not used


def safe_key(text: str) -> str:
    """`text` as a key: only letters, digits, `.`, `_` and `-` (it names a file), at most 80 characters."""
    return _KEY_CHARS.sub("-", text.strip()).strip("-.")[:_MAX_KEY] or "gpu"


def gpu_key() -> GpuKey | None:
    """The key of the GPU this process's harness measures on, None where it can see no GPU (and no
    key is named explicitly)."""
    explicit = os.environ.get(ENV_LANE_KEY, "").strip()
    if explicit:
        return GpuKey(key=safe_key(explicit), source="explicit", note=f"named by {ENV_LANE_KEY}")
    if no_gpu_reason() is not None:
        return None
    return resolve_key(os.environ.get(ENV_VISIBLE), _smi_gpus())


def resolve_key(visible: str | None, gpus: list[SmiGpu] | None) -> GpuKey:
    """The key of CUDA device 0 given `CUDA_VISIBLE_DEVICES` (None: unset) and nvidia-smi's list
    (None: nvidia-smi unavailable). Pure: `gpu_key` supplies both."""
    first = (visible or "").split(",")[0].strip() if visible is not None else ""
    if first.startswith("MIG-"):
        return GpuKey(key=safe_key(first), source="mig")
    if gpus is None:
        return _fallback(first, "nvidia-smi is not available to name the GPU by its UUID")
    if not first or first.isdigit():
        index = int(first) if first else 0
        found = [g for g in gpus if g.index == index]
        if found:
            return GpuKey(key=safe_key(found[0].uuid), source="uuid")
        return _fallback(first, f"nvidia-smi lists no GPU of index {index}")
    matches = [g for g in gpus if g.uuid.startswith(first)]
    if len(matches) == 1:
        return GpuKey(key=safe_key(matches[0].uuid), source="uuid")
    return _fallback(first, f"{len(matches)} of the GPUs nvidia-smi lists match {ENV_VISIBLE}={first!r}")


def parse_smi(text: str) -> list[SmiGpu]:
    """The GPUs in the output of `nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader`."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit() and parts[1]:
            gpus.append(SmiGpu(index=int(parts[0]), uuid=parts[1], name=", ".join(parts[2:])))
    return gpus


def _fallback(first: str, why: str) -> GpuKey:
    name = f"index-{first or 0}" if not first or first.isdigit() else first
    return GpuKey(key=safe_key(name), source="fallback", note=why)


@functools.lru_cache(maxsize=1)
def _smi_gpus() -> list[SmiGpu] | None:
    """The GPUs nvidia-smi lists, None when it cannot be run (asked once per process)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi could not list the GPUs (%s): the GPU lane falls back to a key by index", exc)
        return None
    if out.returncode != 0:
        log.warning("nvidia-smi failed (exit %s: %s): the GPU lane falls back to a key by index",
                    out.returncode, out.stderr.strip()[:200])
        return None
    gpus = parse_smi(out.stdout)
    if len({g.name for g in gpus}) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        log.warning("GPUs of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA may number them "
                    "otherwise than nvidia-smi, and the GPU lane may lock another GPU than the one measured on; "
                    "set CUDA_DEVICE_ORDER=PCI_BUS_ID")
    return gpus
