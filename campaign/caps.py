"""What one campaign a client starts through a server (`campaign.job`) may take, set by the operator.

Such a campaign runs on the operator's GPU, disk and LLM budget, and every count below multiplies
what it takes, so each has a cap (`CampaignCaps`, read from the operator's ``KB_MCP_CAMPAIGN_MAX_...``
settings). The operator's own campaigns (`kb-mcp run-campaign`, the shell) are not capped.

* `problems`, `iterations`, `steps`: each step keeps a record (about 5 KB with small kernels) and the
  source of each attempt (up to 1 MiB each) in the campaign folder, asks the LLM for a lowering and a
  review, and profiles and verifies on the GPU; iterations=steps=1000 would be a million steps a
  problem, and a folder of thousands of problem files (or a KernelBench checkout) multiplies that
  again. A client keeps up to `CAMPAIGNS_KEPT_PER_CLIENT` finished campaign folders, so these caps
  bound the disk one client holds too.
* `fix_attempts`, `generate_attempts`: each attempt is one more LLM answer, build, verification and
  kept source.
* `parallel`: trajectories at once, each a thread of the server's process. The server verifies on
  its own GPU, whose lane serves holds first come, first served: each trajectory at once puts one
  more of this client's verifications ahead of every other client's call, one more build at once on
  the server's CPUs and one more request at once to the operator's LLM endpoint. Unbounded, one
  campaign could start a thread per trajectory (problems x iterations).

Not capped: `top_k` (at most 10, `CampaignConfig`; one KB read per step whatever its value, only the
first suggestion is applied), `gradient_every` (at most one textual-gradient update per recorded
outcome, which the steps bound), `temperature` and the rest (they cost nothing more).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.campaign.models import CampaignConfig
from kb_mcp.campaign.names import CampaignError
from kb_mcp.kb import settings

__all__ = ["CAMPAIGN_MAX_ATTEMPTS", "CAMPAIGN_MAX_ITERATIONS", "CAMPAIGN_MAX_PARALLEL", "CAMPAIGN_MAX_PROBLEMS",
           "CAMPAIGN_MAX_STEPS", "CAPPED", "CampaignCaps", "Cap"]

CAMPAIGN_MAX_ITERATIONS = 100  # ten times the default (10): larger campaigns run from the shell
CAMPAIGN_MAX_STEPS = 100  # ten times the default (10)
CAMPAIGN_MAX_ATTEMPTS = 10  # fix_attempts and generate_attempts each: about three times the defaults (3, 4)
CAMPAIGN_MAX_PROBLEMS = 50
"""A whole KernelBench level 3 (50 problems), half of level 1 or 2: at the default 10 x 10 steps, 5,000 steps
in one campaign, days of one GPU's lane; a larger set runs as several campaigns, one after another."""
CAMPAIGN_MAX_PARALLEL = 4
"""A few trajectories at once keep the server's one GPU busy while the others wait for the LLM or a
build (most of a step); more would only wait in the lane's line, ahead of the other clients."""


class Cap(NamedTuple):
    """One cap: the `CampaignCaps` field, the operator's setting, its default, and what it counts."""

    field: str
    setting: str
    default: int
    counts: str


# The campaign's options and the cap of each (the two attempt counts share one).
CAPPED: Mapping[str, Cap] = {
    "problems": Cap("problems", "KB_MCP_CAMPAIGN_MAX_PROBLEMS", CAMPAIGN_MAX_PROBLEMS, "problems"),
    "iterations": Cap("iterations", "KB_MCP_CAMPAIGN_MAX_ITERATIONS", CAMPAIGN_MAX_ITERATIONS, "iterations"),
    "steps": Cap("steps", "KB_MCP_CAMPAIGN_MAX_STEPS", CAMPAIGN_MAX_STEPS, "steps"),
    "fix_attempts": Cap("attempts", "KB_MCP_CAMPAIGN_MAX_ATTEMPTS", CAMPAIGN_MAX_ATTEMPTS, "fix attempts"),
    "generate_attempts": Cap("attempts", "KB_MCP_CAMPAIGN_MAX_ATTEMPTS", CAMPAIGN_MAX_ATTEMPTS, "generate attempts"),
    "parallel": Cap("parallel", "KB_MCP_CAMPAIGN_MAX_PARALLEL", CAMPAIGN_MAX_PARALLEL, "trajectories at once"),
}


class CampaignCaps(BaseModel):
    """The most one client's campaign may take on this server (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    problems: int = Field(CAMPAIGN_MAX_PROBLEMS, ge=1)
    iterations: int = Field(CAMPAIGN_MAX_ITERATIONS, ge=1)
    steps: int = Field(CAMPAIGN_MAX_STEPS, ge=1)
    attempts: int = Field(CAMPAIGN_MAX_ATTEMPTS, ge=1)
    parallel: int = Field(CAMPAIGN_MAX_PARALLEL, ge=1)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CampaignCaps:
        """The caps the operator set (``KB_MCP_CAMPAIGN_MAX_...``), each its default where unset;
        SettingError for a value that is not a whole number of 1 or more (a cap of 0 would refuse
        every campaign: the operator who wants none gives clients no LLM endpoint)."""
        caps = {cap.field: settings.count(cap.setting, cap.default, environ, positive=True) for cap in CAPPED.values()}
        return cls(**caps)

    def refusal(self, option: str, value: int) -> str | None:
        """Why `value` of the campaign option `option` is more than a client's campaign may take, in
        words naming the cap and the setting that raises it; None where it is within (or not capped)."""
        cap = CAPPED.get(option)
        if cap is None or value <= (most := getattr(self, cap.field)):
            return None
        fewer = ("name fewer problem files, or narrow a folder with `level` and `problem_ids`" if option == "problems"
                 else f"ask for {most} or fewer")
        given = f"{value} problems selected" if option == "problems" else f"{option}={value}"
        return (f"{given}: a campaign started through this server takes at most {most} {cap.counts} "
                f"({cap.setting}={most}, the server operator's setting). To run it, {fewer}; the operator can "
                f"raise {cap.setting} where the server runs, or run a larger campaign with `kb-mcp run-campaign`")

    def check(self, config: CampaignConfig) -> None:
        """Refuses (CampaignError, the caller's) a run whose configuration, as it will run (the problems
        selected, a resumed campaign's stored counts), is over a cap."""
        given = {option: getattr(config, option) for option in CAPPED if option != "problems"}
        for option, value in {"problems": len(config.problems), **given}.items():
            said = self.refusal(option, value)
            if said is not None:
                raise CampaignError(said)
