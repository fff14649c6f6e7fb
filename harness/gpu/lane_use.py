"""How one verification used the GPU lane, reported beside its phases (`VerifyResult.lane`).

The lane should be held for GPU work only: a verification builds its candidate, and the caller
reads and stores, before and after it (`harness.pool.pool`). So each result says how long it waited in
line for the lane and how long it held it; `held_s` set against the phases run under it
(`LaneUse.GPU_PHASES`) shows whether anything else ran while every other agent waited.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LaneUse"]


class LaneUse(BaseModel):
    """The lane as one verification used it (summed over its holds)."""

    model_config = ConfigDict(extra="forbid")

    # The phases a verification runs holding the lane (`harness.phases`); "build_first" and "lane"
    # come before it, the caller's KB write after it.
    GPU_PHASES: ClassVar[tuple[str, ...]] = ("queued", "reference_baselines", "static", "import", "construct",
                                             "check", "census", "probes", "timing", "baselines", "evidence",
                                             "finish")

    waited_s: float = Field(0.0, description="seconds waiting in line for the lane")
    held_s: float = Field(0.0, description="seconds holding it")
    place: int = Field(0, description="holds ahead in line as it arrived (the holder's included)")
    holds: int = Field(0, description="how many holds (0: it never needed the lane, e.g. compile-only)")
    gpu: str = Field("", description="the GPU's key ('' where none is visible)")
    machine: bool = Field(False, description="held machine-wide (no other kb-mcp process used the GPU meanwhile)")

    def add(self, waited_s: float, held_s: float, place: int, gpu: str, machine: bool) -> LaneUse:
        """This use with one more hold."""
        return LaneUse(waited_s=round(self.waited_s + waited_s, 3), held_s=round(self.held_s + held_s, 3),
                       place=place if not self.holds else self.place, holds=self.holds + 1, gpu=gpu or self.gpu,
                       machine=machine if not self.holds else self.machine and machine)

    def beyond_gpu_phases(self, phases_s: dict[str, float]) -> float:
        """Seconds it held the lane beyond the phases run under it (what "GPU phases + 1 s" bounds)."""
        return round(self.held_s - sum(v for k, v in phases_s.items() if k in self.GPU_PHASES), 3)
