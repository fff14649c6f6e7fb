"""What `kb-mcp eval` (`campaign.evaluate`) is asked and answers: its options, each problem's line with its
times, and the result; and its error.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.campaign.models import Retry
from kb_mcp.campaign.report import CampaignReport
from kb_mcp.campaign.store import CampaignError
from kb_mcp.kb.models import DEFAULT_TRACK, Track, Verdict

__all__ = ["EvalError", "EvalLine", "EvalOptions", "EvalResult", "StepTimes"]


class EvalError(CampaignError):
    """The eval cannot run as asked (selection, track, folder); the message says what to change."""


class EvalOptions(BaseModel):
    """What to evaluate."""

    model_config = ConfigDict(extra="forbid")

    problems: list[str] = Field(description="problem files, folders of them, or a KernelBench checkout")
    solutions: str | None = Field(None, description="folder of solution files, matched to problems by name")
    level: int | None = Field(None, ge=1, description="KernelBench level to take")
    ids: str | None = Field(None, description="problem ids and ranges, e.g. 1-20,40")
    track: Track = Field(DEFAULT_TRACK, description="precision track the solutions are verified in")
    mode: Literal["own", "composed"] | None = Field(
        None, description="verification mode of every problem (None: composed for level 3, own kernels otherwise)")
    compile_only: bool = Field(False, description="compile only (no GPU): verdict needs_gpu, nothing timed")
    build_jobs: int | None = Field(
        None, ge=0, le=256,
        description="solutions built ahead at once while the GPU verifies (0: none, the serial eval; default: what "
                    "the CPU cores and memory hold, harness.ahead.default_jobs)")


class StepTimes(BaseModel):
    """Where one problem's time went (seconds)."""

    model_config = ConfigDict(extra="forbid")

    wall_s: float  # the whole step: waiting for its builds ahead, then its verification
    wait_s: float = 0.0  # waiting for its builds ahead, before the verification started
    verify_s: float = 0.0  # the verification (GPU lane held), less the time its worker spent building
    build_s: float = 0.0  # building inside the verification (what was not built ahead; NVRTC included)
    # timing baselines ahead (GPU lane held) while the step waited for its build: its own problem's or
    # the next ones' (`BaselinesAhead`); not part of wait_s
    baselines_s: float = 0.0


class EvalLine(BaseModel):
    """One problem's outcome, for the terminal."""

    model_config = ConfigDict(extra="forbid")

    problem: str
    solution: str | None = None
    verdict: Verdict | None = None
    speedup: float | None = None  # over the better of eager and torch.compile
    note: str = ""
    times: StepTimes | None = None  # for problems verified in this run
    worker: str | None = None  # the cluster's worker that verified it (an eval on a cluster)
    baseline_cached: bool | None = None  # its verification found its baselines cached (None: nothing timed)
    baseline_ahead: bool = False  # this eval timed its baselines ahead, while a build finished


class EvalResult(BaseModel):
    """The evaluated problems and where the report is."""

    model_config = ConfigDict(extra="forbid")

    folder: str
    lines: list[EvalLine]
    report_md: str
    report_json: str
    report: CampaignReport
    retried: list[Retry] = Field(default_factory=list, description="verifications re-run after their worker died")
