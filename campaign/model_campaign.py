"""`run-campaign --model`: a campaign on a model (docs/campaigns.md, "A model").

The model is decomposed (`tools.decompose_problem`); its parts are optimized one campaign each, as
problems of their own (so what the KB knows of level-1/2 problems applies, and their outcomes are
recorded as for any problem), in order of their share of the model's time. Before each part, Amdahl's
law says whether the model can still reach the target: with the parts done at the speedups their best
verdicts measured and every remaining part at `part_cap`, the model's bound; where it falls below the
target the rest cannot reach it and the campaign stops there, and where the parts done already reach
it no more are needed. The whole-model candidate is then composed (each part's best standard verdict in
the KB; without a GPU, the part campaigns' best compiled kernels, labelled unverified) and verified end
to end in composed mode; its verdict is stored in the KB under the model's own problem, and the run's
record is `model.json` in the campaign folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from kb_mcp.campaign.runner import CampaignOptions, run_campaign
from kb_mcp.clients.llm import LLMConfig
from kb_mcp.decomposition.assemble import part_hash, write_composed
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.tools import compile_and_verify, decompose_problem
from kb_mcp.tools.context import ToolContext

MODEL_RECORD = "model.json"


class PartRun(BaseModel):
    """One part's campaign: where it ran and what its best verdict measured."""

    part: str
    label: str
    share: float
    folder: str
    speedup: float | None = Field(None, description="its best standard verdict's speedup (None: not measured)")
    best_kernel: str | None = None


class ModelCampaign(BaseModel):
    """A campaign on a model: its parts' runs, why it stopped, and the composed candidate's verdict."""

    problem: str
    parts_dir: str
    target: float
    part_cap: float
    parts: list[PartRun] = Field(default_factory=list)
    stopped: str = ""  # why no further part was optimized
    bound: float = Field(0.0, description="Amdahl's bound on the model's speedup when it stopped")
    composed_file: str | None = None
    candidate_id: str | None = None
    verdict: str | None = None
    speedup: float | None = None
    coverage: float | None = None


def amdahl(shares: list[float], speedups: list[float]) -> float:
    """The model's speedup when parts of these shares (summing to one) run this much faster."""
    time = sum(s / max(x, 1e-9) for s, x in zip(shares, speedups))
    return 1.0 / time if time > 0 else float("inf")


def bound_now(ranked_shares: list[float], done: list[float], cap: float) -> float:
    """Amdahl's bound with the first len(done) parts at their speedups and the rest at `cap`."""
    return amdahl(ranked_shares, [*done, *[cap] * (len(ranked_shares) - len(done))])


def _measured(ctx: ToolContext, parts_dir: Path, file: str) -> float | None:
    with ctx.store.read() as view:
        best = view.composed_verdict(part_hash(parts_dir, file))
    return best.speedup_vs_baseline if best else None


def run_model_campaign(folder: Path, kb_path: Path, model: Path, options: CampaignOptions, llm: LLMConfig, *,
                       target: float = 1.6, part_cap: float = 4.0, ctx: ToolContext | None = None,
                       log: Callable[[str], None] = print) -> ModelCampaign:
    """Decomposes `model`, runs a campaign on its parts by share while Amdahl allows the target, composes
    the whole-model candidate and verifies it in composed mode; writes and returns the record."""
    own_ctx = ctx is None
    ctx = ctx or ToolContext(kb_path, client_name="kb-mcp campaign")
    try:
        parts_dir = folder / "parts"
        got = decompose_problem.run_in(ctx, decompose_problem.Request(problem=str(model), top=500), parts_dir)
        ranked = list(got.parts)
        shares = [p.share for p in ranked]
        record = ModelCampaign(problem=got.problem, parts_dir=str(parts_dir), target=target, part_cap=part_cap)
        done: list[float] = []
        chosen: dict[str, Path] = {}
        for part in ranked:
            record.bound = bound_now(shares, done, part_cap)
            if record.bound < target:
                record.stopped = (f"the remaining parts cannot reach {target}x: even at {part_cap}x each, the "
                                  f"model's bound is {record.bound:.2f}x (Amdahl)")
                break
            if done and amdahl(shares, [*done, *[1.0] * (len(shares) - len(done))]) >= target:
                record.stopped = f"the parts done reach {target}x"
                break
            log(f"{got.problem}: optimizing {part.name} ({100 * part.share:.1f} % of the model, {part.label})")
            part_folder = folder / "part-campaigns" / part.name
            run_campaign(part_folder, kb_path, options.model_copy(update={"problems": [part.file]}), llm, ctx=ctx,
                         log=log)
            best = part_folder / "best" / f"{part.name}.py"
            speedup = _measured(ctx, parts_dir, str(Path(part.file).relative_to(parts_dir)))
            if speedup is None and options.compile_only and best.is_file():
                chosen[part.name] = best  # no GPU: the campaign's compiled kernel, unverified, goes in
            done.append(speedup or 1.0)
            record.parts.append(PartRun(part=part.name, label=part.label, share=part.share, folder=str(part_folder),
                                        speedup=speedup, best_kernel=str(best) if best.is_file() else None))
        else:
            record.stopped = "every part was optimized"
            record.bound = bound_now(shares, done, part_cap)
        with ctx.store.read() as view:
            composition = write_composed(parts_dir, view, ctx.candidates_dir, chosen)
        record.composed_file = composition.file
        log(f"{got.problem}: composed from {composition.own_parts} candidate parts; verifying in composed mode")
        check = compile_and_verify.run(ctx, compile_and_verify.Request(problem=str(model),
                                                                       candidate=composition.file, mode="composed"))
        rec = check.record
        record.candidate_id, record.verdict = rec.candidate_id, rec.verdict.value
        record.speedup, record.coverage = rec.speedup_vs_baseline, rec.coverage
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / MODEL_RECORD, record.model_dump_json(indent=1))
        return record
    finally:
        if own_ctx:
            ctx.close()
