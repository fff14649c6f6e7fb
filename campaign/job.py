"""The campaign as an MCP job kind (`start_job(kind="run_campaign", arguments={...})`).

Follows the tool-module convention (NAME, DESCRIPTION, Request, Result, run), so the server's
job machinery runs it in the background, stores its progress beside the KB, and returns this
module's Result from `job_status` once it ends.

The LLM endpoint and its key are the operator's: both come from the server's environment
(KB_MCP_LLM_BASE_URL, KB_MCP_LLM_API_KEY). A client may choose the model, never the endpoint: the
server would send its own key there, and the answers, written by whoever runs that endpoint, would
edit the shared KB with the campaign's authority. The key is never part of the stored arguments.
The campaign reads the problem files it is given (`problems`) on the server, through
`CampaignOptions.config` (`campaign.runner`, `select_problems` then `resolve_problems`).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from kb_mcp.campaign.caps import CAPPED, CampaignCaps
from kb_mcp.campaign.names import CAMPAIGN_NAME, DEFAULT_CAMPAIGN_NAME, CampaignError, campaign_folder
from kb_mcp.campaign.owners import campaigns_kept_per_client, trim
from kb_mcp.campaign.runner import CampaignOptions, CampaignSummary, run_campaign
from kb_mcp.campaign.selection import SelectionError, select_problems
from kb_mcp.clients.llm import ENV_API_KEY, ENV_BASE_URL, LLMConfig, LLMNotConfigured, LLMSettingInvalid
from kb_mcp.kb.errors import EnvironmentFault, KbMcpError
from kb_mcp.tools.base import Progress, ToolError, ToolMeta, no_progress
from kb_mcp.tools.context import ToolContext
from kb_mcp.tools.source import readable_problems

log = logging.getLogger(__name__)

NAME = "run_campaign"
DESCRIPTION = """\
Run an autonomous optimization campaign over a set of KernelBench-format problems with the
server's own LLM (configured on the server: KB_MCP_LLM_BASE_URL / KB_MCP_LLM_MODEL / KB_MCP_LLM_API_KEY;
`model` here picks another model of that endpoint). For each problem it generates a CUDA kernel,
then runs iterations x steps of profile -> classify -> suggest -> lower -> compile_and_verify ->
review -> record_outcome, with textual-gradient KB updates. Start it with start_job; it takes
minutes to hours. Rerunning with the same `name` resumes a stopped campaign; a name another client's
(or the operator's) campaign holds is refused: choose your own. Each client keeps the folders of its
newest few finished campaigns (KB_MCP_CAMPAIGNS_KEPT_PER_CLIENT, default 10); older ones go as its
campaigns end. A campaign takes at most """ + ", ".join(
    f"{cap.default} {'fix or generate attempts' if cap.field == 'attempts' else cap.counts} ({cap.setting})"
    for option, cap in CAPPED.items() if option != "generate_attempts") + """ by default: its operator may set
other caps. The result gives the report paths, the best kernel files and the headline numbers (valid rate,
geomean speedup)."""

META = ToolMeta(
    title="Run an optimization campaign",
    # The campaign's own profiles and verifications go through the GPU tools, which hold the GPU
    # lane call by call; holding it for the whole campaign would stop every client for hours.
    uses_gpu=False,
    open_world=True,  # talks to an LLM endpoint
    long_running=True,  # hours against an endpoint that may stall: its own job slots (server.job_slots)
)


def _capped(option: str, what: str) -> str:
    cap = CAPPED[option]
    return f"{what} (at most the server operator's {cap.setting}, default {cap.default})"


class Request(CampaignOptions):
    """Campaign settings; None leaves the stored value (resume) or the default."""

    model_config = ConfigDict(extra="forbid")

    # Capped by the operator's settings (`campaign.caps`), read when a request comes: a schema maximum
    # would be fixed at import, and wrong wherever the operator sets another.
    problems: list[str] = Field(default_factory=list, description=_capped(
        "problems", "problem files or folders, empty to resume; the problems selected from them"))
    iterations: int | None = Field(None, ge=1, description=_capped("iterations", "trajectories per problem"))
    steps: int | None = Field(None, ge=1, description=_capped("steps", "steps per trajectory"))
    parallel: int | None = Field(None, ge=1, description=_capped("parallel", "trajectories at once"))
    fix_attempts: int | None = Field(None, ge=1, description=_capped(
        "fix_attempts", "candidates per lowering step (first try plus fixes)"))
    generate_attempts: int | None = Field(None, ge=1, description=_capped(
        "generate_attempts", "candidates for the initial kernel (first try plus fixes)"))

    name: str = Field(DEFAULT_CAMPAIGN_NAME, pattern=CAMPAIGN_NAME,
                      description="campaign folder name beside the KB (a letter or digit first)")
    base_url: str | None = Field(None, description="leave out: the LLM endpoint is the server operator's "
                                 f"({ENV_BASE_URL}); only that same URL is accepted here")
    model: str | None = Field(None, description="model for every role (default: the server's environment)")

    @field_validator("iterations", "steps", "parallel", "fix_attempts", "generate_attempts")
    @classmethod
    def _within_caps(cls, value: int | None, info: ValidationInfo) -> int | None:
        """Refuses, when the job is started, a count over the operator's cap; the run checks the
        campaign as it will run too (the problems selected, a resumed campaign's stored counts)."""
        said = None if value is None else CampaignCaps.from_env().refusal(info.field_name or "", value)
        if said is not None:
            raise ValueError(said)
        return value

    @field_validator("base_url")
    @classmethod
    def _operators_endpoint(cls, url: str | None) -> str | None:
        """Only the operator's endpoint: the server sends its own key to it (see the module docstring)."""
        operators = os.environ.get(ENV_BASE_URL) or None
        if url is not None and url.rstrip("/") != (operators or "").rstrip("/"):
            raise ValueError(
                "a campaign run through this server talks to the server operator's LLM endpoint, with the "
                f"operator's key; a client cannot choose another. Leave base_url out (the operator sets the "
                f"endpoint with {ENV_BASE_URL} where the server runs, or runs `kb-mcp run-campaign --llm-base-url` "
                "on their own machine)")
        return url


Result = CampaignSummary  # the headline only: the full report stays in its files


def _answer(message: str, environment: bool) -> KbMcpError:
    """A refusal as the server answers it: the environment's (no argument the caller can change fixes
    it), else the caller's."""
    return EnvironmentFault(message) if environment else ToolError(message)


def _unconfigured(exc: LLMNotConfigured) -> KbMcpError:
    """No usable LLM for the campaign: the operator's to fix where the server has no endpoint or one of
    its KB_MCP_LLM_ settings is malformed; the caller's where only a model is missing (`model` names one)."""
    operators = os.environ.get(ENV_BASE_URL) or os.environ.get(ENV_API_KEY)
    return _answer(str(exc), isinstance(exc, LLMSettingInvalid) or not operators)


def _refusal(exc: CampaignError) -> KbMcpError:
    """A campaign's refusal, keeping whose it is (another run holding its folder, a kept kernel gone: the
    machine's)."""
    return _answer(str(exc), exc.whose == "environment")


def run(ctx: ToolContext, req: Request, progress: Progress = no_progress) -> Result:
    """Runs (or resumes) the campaign named `req.name` on this server's KB."""
    try:
        llm = LLMConfig.from_env(model=req.model).require()  # the endpoint and key: the operator's only
    except LLMNotConfigured as exc:
        raise _unconfigured(exc) from exc
    try:
        folder = campaign_folder(ctx.kb_path, req.name)
    except CampaignError as exc:
        raise _refusal(exc) from exc
    options = CampaignOptions.model_validate(req.model_dump(include=set(CampaignOptions.model_fields)))
    _readable(ctx, options)
    counts: dict[str, tuple[int, int]] = {}
    lock = threading.Lock()

    def forward(problem: str, done: int, total: int, message: str) -> None:
        with lock:
            counts[problem] = (done, total)
            all_done = sum(d for d, _ in counts.values())
            all_total = sum(t for _, t in counts.values())
        progress(all_done, all_total, f"{problem}: {message}")

    # a bad setting fails here, by name
    client, keep, caps = ctx.client_name, campaigns_kept_per_client(), CampaignCaps.from_env()
    try:
        result = run_campaign(folder, ctx.kb_path, options, llm, progress=forward, ctx=ctx, client=client, caps=caps)
    except CampaignError as exc:
        raise _refusal(exc) from exc
    finally:  # however it ended (a cancel too): the client's older finished campaigns beyond its bound go
        _trim(folder.parent, client, keep)
    return result.headline()


def _trim(root: Path, client: str, keep: int) -> None:
    """`owners.trim`, with a disk that refuses logged: the campaign's own result stands, and the next
    campaign of the client to end tries again."""
    try:
        trim(root, client, keep)
    except OSError as exc:
        log.warning("could not remove old campaign folders of %s in %s: %s", client or "a client", root, exc)


def _readable(ctx: ToolContext, options: CampaignOptions) -> None:
    """Refuses, as `compile_and_verify` would, a problem path the server may not read for this caller
    (`ToolContext.files`): a campaign reads its problems on the server's machine."""
    if ctx.files is None or not options.problems:
        return
    try:
        refs = select_problems(list(options.problems), level=options.level, ids=options.problem_ids)
    except SelectionError:
        refs = []  # nothing selected: the campaign itself says so, once the paths are known to be readable
    readable_problems(ctx.files, options.problems, [r.path for r in refs])
