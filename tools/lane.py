"""The GPU lane as the tools hold it: one timing or profiling at a time on the GPU, across every
thread of this process and every kb-mcp process of the machine.

Two measurements sharing a GPU each measure the other's interference, so every path that times
or profiles (MCP calls, jobs, the campaign, `kb-mcp call`) takes the lane. The tool modules that
time or profile declare it (`ToolMeta.uses_gpu`): `profile_kernel`'s `run` holds the lane for the
whole call (`tools.base.on_gpu_lane`); `compile_and_verify`'s leaves it to the harness, which holds it
around the GPU work of the verification only (`tools.base.gpu_lane_inside`), so no caller can go
around it either way.
The lane itself (machine-wide per GPU, keyed by its UUID; holds re-entrant within a thread, logged
with the GPU, pid and timestamps; waiting reported as progress) is the harness's
(`harness.gpu.lane`), which also takes it around each GPU request of its own, inside a tool's hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kb_mcp.harness.gpu import lane
from kb_mcp.harness.gpu.lane import LaneHold
from kb_mcp.kb.progress import Progress, no_progress

__all__ = ["GpuLane"]


class GpuLane:
    """A `ToolContext`'s handle on the GPU lane (every handle of a process holds the same one)."""

    @property
    def holder(self) -> str:
        """What holds the lane in this process now ('' when free)."""
        return lane.holder()

    @contextmanager
    def hold(self, holder: str, progress: Progress = no_progress) -> Iterator[LaneHold]:
        """Holds the lane for the block; waits (reporting whom for) while another thread or process
        holds it. Re-entrant per thread: a tool that holds the lane may call another GPU tool's function."""
        with lane.hold(holder, progress) as now:
            yield now
