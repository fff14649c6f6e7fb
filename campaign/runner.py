"""Starting, resuming and reporting a campaign: what the CLI and the MCP job both call.

`run_campaign` merges the options given now with the configuration stored in the folder (a
rerun without problems resumes with the stored ones), builds the bench on the KB and the LLM
client, runs the loop and returns a short result.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.campaign.bench import Bench, Verifier
from kb_mcp.campaign.caps import CampaignCaps
from kb_mcp.campaign.loop import Campaign, CampaignAborted, ProblemProgress
from kb_mcp.campaign.models import CampaignConfig, retried_text
from kb_mcp.campaign.owners import may_run
from kb_mcp.campaign.problems import resolve_problems
from kb_mcp.campaign.report import CampaignReport, report_from_store
from kb_mcp.campaign.report_render import write_report
from kb_mcp.campaign.selection import SelectionError, select_problems
from kb_mcp.campaign.store import CampaignError, CampaignStore
from kb_mcp.campaign.units import CampaignStopped
from kb_mcp.clients.llm import LLMClient, LLMConfig, Role
from kb_mcp.kb.models import Track
from kb_mcp.tools import compile_and_verify
from kb_mcp.tools.context import ToolContext

if TYPE_CHECKING:
    from kb_mcp.campaign.cluster import Cluster


class CampaignOptions(BaseModel):
    """Settings given for this run; None keeps the stored value (on resume) or the default."""

    model_config = ConfigDict(extra="forbid")

    problems: list[str] = Field(default_factory=list, description="Problem files or folders; empty to resume.")
    iterations: int | None = Field(None, ge=1)
    steps: int | None = Field(None, ge=1)
    parallel: int | None = Field(None, ge=1)
    top_k: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    fix_attempts: int | None = Field(None, ge=1)
    generate_attempts: int | None = Field(None, ge=1)
    gradient_every: int | None = Field(None, ge=0)
    review: bool | None = None
    compile_only: bool | None = None
    seed: int | None = None
    arch: str | None = None
    track: Track | None = Field(None, description="Precision track the candidates are verified in (default fp32).")
    level: int | None = Field(None, ge=1, description="KernelBench level to take from the problem paths.")
    problem_ids: str | None = Field(None, description="Problem ids and ranges to take, e.g. 1-20,40.")

    def config(self, stored: CampaignConfig | None, llm: LLMConfig) -> CampaignConfig:
        """The configuration of this run: stored values, overridden by what was given now."""
        given = self.model_dump(exclude_none=True, exclude={"problems", "level", "problem_ids"})
        if self.problems:
            try:
                refs = select_problems(list(self.problems), level=self.level, ids=self.problem_ids)
            except SelectionError as exc:
                raise CampaignError(str(exc), whose=exc.whose) from exc
            given["problems"] = resolve_problems([r.path for r in refs])
        elif stored is None:
            raise CampaignError("no problems given and no campaign to resume in this folder")
        given["models"] = {role.value: llm.model_for(role) for role in Role}
        if stored is not None and self.track is not None and self.track != stored.track:
            raise CampaignError(f"this campaign runs in the {stored.track.value} track; its results cannot be "
                                f"ranked with {self.track.value} ones: start another campaign (--name or --out) "
                                "for that track")
        base = stored.model_dump() if stored is not None else {}
        return CampaignConfig.model_validate({**base, **given})


class CampaignSummary(BaseModel):
    """Headline numbers of a finished (or stopped) run and where its report is: what the MCP job returns."""

    model_config = ConfigDict(extra="forbid")

    folder: str
    finished: bool
    summary: str
    report_md: str | None = None
    report_json: str | None = None
    best_kernels: list[str] = Field(default_factory=list)
    valid_rate: float | None = None
    geomean_speedup: float | None = None
    problems: int = 0


class CampaignResult(CampaignSummary):
    """A run's summary with its full report."""

    report: CampaignReport | None = None

    def headline(self) -> CampaignSummary:
        """The summary without the full report (small enough for an agent's context)."""
        return CampaignSummary.model_validate(self.model_dump(exclude={"report"}))


def summarize(report: CampaignReport) -> str:
    """A few lines for the terminal."""
    s = report.speedup
    lines = [
        f"{len(report.problems)} problems, {report.run_label()}: valid rate {report.valid_rate:.0%}, "
        f"{report.candidates} candidates ({report.compile_rate or 0:.0%} compiled)",
    ]
    if s.n:
        lines.append(
            f"speedup over the better of eager and torch.compile: geomean {s.geomean:.2f}x, "
            f"median {s.median:.2f}x, min {s.min:.2f}x, max {s.max:.2f}x (n={s.n})"
        )
    lines.append(
        f"KB: {report.gradient.applied} textual-gradient edits applied, {report.gradient.rejected} rejected; "
        f"tokens {report.tokens.total.total} in {report.tokens.total.calls} calls"
    )
    lines += report.notes
    return "\n".join(lines)


def run_campaign(
    folder: Path,
    kb_path: Path,
    options: CampaignOptions,
    llm_config: LLMConfig,
    *,
    progress: ProblemProgress | None = None,
    log: Callable[[str], None] | None = None,
    ctx: ToolContext | None = None,
    cluster: Cluster | None = None,
    client: str | None = None,
    caps: CampaignCaps | None = None,
) -> CampaignResult:
    """Runs or resumes the campaign in `folder` on the KB at `kb_path`.

    Raises CampaignError for unusable settings, KeyboardInterrupt when interrupted (after saving).
    A run stopped by an LLM failure returns `finished=False` with the reason in `summary`. With
    `ctx` (a server's), its KB and worker pool are used and left open; otherwise one is made here.
    With `cluster`, candidates are verified on its workers (`parallel` defaults to its GPUs then).
    `client` is the server client running it (`campaign.owners`: it may run only its own folders);
    None for the operator's shell. `caps` (a server client's, `campaign.caps`) refuses a run over them,
    as it will run, before anything is asked or written; None (the operator's shell): not capped.
    """
    own_ctx = ctx is None
    if ctx is None:
        ctx = ToolContext(kb_path, client_name="kb-mcp campaign")
    store = CampaignStore(folder)
    stored = store.read_status()
    if stored is not None:  # before its settings are compared with this run's (the run checks again, locked)
        may_run(stored, client, folder)
    if cluster is not None and options.parallel is None and (stored is None or stored.config.parallel == 1):
        options = options.model_copy(update={"parallel": cluster.capacity})  # a trajectory per GPU at least
    config = options.config(stored.config if stored else None, llm_config)
    if caps is not None:
        caps.check(config)
    llm = LLMClient(llm_config)
    bench = Bench(ctx, arch=config.arch, track=config.track, verifier=_verifier(ctx, cluster))
    kwargs: dict[str, object] = {}
    if progress is not None:
        kwargs["progress"] = progress
    if log is not None:
        kwargs["log"] = log
    campaign = Campaign(config, store, bench, llm, kb_path=str(ctx.kb_path), client=client, **kwargs)  # type: ignore[arg-type]
    aborted = False
    seen = len(cluster.retried) if cluster is not None else 0  # a cluster may serve several runs
    try:
        report = campaign.run()
        finished, prefix = True, "finished"
    except CampaignStopped as exc:
        report, finished, prefix = campaign.report(), False, f"stopped: {exc}"
    except CampaignAborted:
        aborted = True  # threads may still hold the harness: closing it would wait for them
        raise
    finally:
        if cluster is not None:  # what this run re-ran, kept however it ends (the report lists every run's)
            store.write_retried(cluster.retried[seen:])
        if not aborted:
            if own_ctx:
                ctx.close()
            llm.close()
    best = sorted(str(p) for p in (folder / "best").glob("*.py")) if (folder / "best").is_dir() else []
    retried = retried_text(cluster.retried[seen:]) if cluster is not None else ""
    if retried:  # the report written by the run did not have this run's yet
        report = campaign.report()
        write_report(report, store.report_dir)
    return CampaignResult(
        folder=str(folder),
        finished=finished,
        summary=f"campaign {prefix}\n{summarize(report)}\n" + (f"{retried}\n" if retried else "")
        + f"report: {store.report_dir / 'report.md'}",
        report_md=str(store.report_dir / "report.md"),
        report_json=str(store.report_dir / "report.json"),
        best_kernels=best,
        valid_rate=report.valid_rate,
        geomean_speedup=report.speedup.geomean,
        problems=len(report.problems),
        report=report,
    )


def _verifier(ctx: ToolContext, cluster: Cluster | None) -> Verifier | None:
    """How the campaign verifies: on the cluster's workers, or (None) on this process's pool."""
    if cluster is None:
        return None
    from kb_mcp.campaign.cluster import verify_on

    def on_cluster(request: compile_and_verify.Request) -> compile_and_verify.Result:
        return verify_on(cluster, ctx, request)[0]

    return on_cluster


def campaign_report(folder: Path) -> list[Path]:
    """Rebuilds the report of the campaign in `folder` from its raw records; returns the files written."""
    store = CampaignStore(folder)
    if store.read_status() is None:
        raise CampaignError(f"{folder} holds no campaign (no campaign.json)")
    return write_report(report_from_store(store), store.report_dir)
