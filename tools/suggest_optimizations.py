"""MCP tool `suggest_optimizations`: k optimizations for a state, drawn by weight from the KB."""

from __future__ import annotations

import difflib
import math

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.kb.arch import ArchError, arch_family
from kb_mcp.kb.models import DEFAULT_TRACK, Optimization, Score, State, Track
from kb_mcp.kb.view import KBView
from kb_mcp.policy.select import DEFAULT_TEMPERATURE, select_top_k
from kb_mcp.tools.base import Progress, ToolError, ToolMeta, no_progress
from kb_mcp.tools.context import ToolContext

NAME = "suggest_optimizations"
DESCRIPTION = """\
Suggest optimizations to try next for a kernel in a given performance state, drawn from the shared
Knowledge Base by weighted random top-k: entries that measured well are drawn more often, untried
ones still get a chance. Call it after classify_state, with the state id it returned (e.g.
memory_bandwidth_saturated) and the GPU arch if known (sm_90, 9.0 or hopper). Each suggestion says
what to change in the code, why it fits this state, the expected speedup with its confidence and
sample count (confidence near 0 means the number is a prior, not a measurement), lessons other
agents recorded, and good follow-ups. Pick one, implement it, check it with compile_and_verify, then
report with record_outcome (pass the optimization id). Use `exclude` for ids you already tried on
this kernel; raise `temperature` to explore more, 0 for the top-ranked only."""

META = ToolMeta(
    title="Suggest optimizations for a state",
    read_only=True,
    idempotent=True,
)

MAX_LESSONS = 3
MAX_LESSON_CHARS = 300


class Request(BaseModel):
    """What to suggest for."""

    model_config = ConfigDict(extra="forbid")

    state_id: str = Field(description="KB state id from classify_state, e.g. 'memory_bandwidth_saturated'")
    k: int = Field(3, ge=1, le=10, description="how many distinct suggestions to return")
    temperature: float = Field(
        DEFAULT_TEMPERATURE, ge=0.0, le=5.0,
        description="exploration: 0 = always the top-ranked, 0.3 = default, 1+ = close to uniform",
    )
    arch: str | None = Field(
        None, description="GPU arch of the target (sm_90, 9.0 or hopper); scores of that family are used where measured"
    )
    track: Track = Field(
        DEFAULT_TRACK,
        description="precision track the kernel is judged on: fp32 (strict, default), tf32, bf16 or fp16; only that track's measurements count",
    )
    exclude: list[str] = Field(default_factory=list, description="optimization ids not to suggest (already tried)")
    seed: int | None = Field(None, description="fix the random draw (same seed, same KB -> same suggestions)")


class Suggestion(BaseModel):
    """One optimization as it applies in this state."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    category: str
    what_to_do: str
    why_it_fits: str
    cost: str
    expected_speedup: float = Field(description="posterior estimate: measurements shrunk toward the prior")
    confidence: float = Field(description="0..1: share of the estimate that rests on measurements")
    samples: int = Field(description="valid timed outcomes behind the estimate")
    attempts: int
    failures: int = Field(description="attempts that did not compile or did not verify")
    scored_on: str = Field(description="arch family of the score used ('*' = pooled over all GPUs)")
    lessons: list[str] = Field(default_factory=list)
    follow_ups: list[str] = Field(default_factory=list, description="'id: name' of optimizations that often pay off next")


class Result(BaseModel):
    """The suggestions, best draw first."""

    model_config = ConfigDict(extra="forbid")

    state_id: str
    state_name: str
    bottleneck: str
    arch: str = Field(description="arch family used ('*' = pooled)")
    track: Track = Field(description="precision track whose measurements were used")
    candidates: int = Field(description="optimizations the KB holds for this state (before exclusions)")
    suggestions: list[Suggestion]


def _why(state: State, opt: Optimization, score: Score) -> str:
    parts = [opt.when_helps.strip() or f"Listed for {state.name}."]
    if score.attempts:
        mean = math.exp(score.mean_log_speedup) if score.samples else None
        measured = f"Measured in this state: {score.successes} of {score.attempts} attempts were faster"
        if mean is not None:
            measured += f", geometric-mean speedup x{mean:.2f} over {score.samples} valid runs"
        parts.append(measured + ".")
    else:
        parts.append("Not yet tried in this state: the estimate is a prior.")
    return " ".join(parts)


def _suggestion(view: KBView, state: State, score: Score) -> Suggestion | None:
    opt = view.get_optimization(score.optimization_id)
    if opt is None:
        return None
    follow = []
    for fid in opt.follow_ups:
        f = view.get_optimization(fid)
        if f is not None and not f.deprecated:
            follow.append(f"{f.id}: {f.name}")
    lessons = [
        (lesson.text if len(lesson.text) <= MAX_LESSON_CHARS else lesson.text[: MAX_LESSON_CHARS - 1] + "…")
        for lesson in view.lessons(state.id, opt.id, MAX_LESSONS)
    ]
    return Suggestion(
        id=opt.id,
        name=opt.name,
        category=opt.category,
        what_to_do=opt.description,
        why_it_fits=_why(state, opt, score),
        cost=opt.cost,
        expected_speedup=round(score.expected_speedup, 3),
        confidence=round(score.confidence, 3),
        samples=score.samples,
        attempts=score.attempts,
        failures=score.compile_failures + score.verify_failures,
        scored_on=score.arch,
        lessons=lessons,
        follow_ups=follow,
    )


def _unknown_state(view: KBView, state_id: str) -> ToolError:
    close = difflib.get_close_matches(state_id, view.state_ids(), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return ToolError(
        f"unknown state_id {state_id!r}.{hint} Use the state id that classify_state returned, or list states with the kb://states resource."
    )


def run(ctx: ToolContext, req: Request, progress: Progress = no_progress) -> Result:
    """Draws k optimizations for the state from the KB (see DESCRIPTION)."""
    try:
        family = arch_family(req.arch)
    except ArchError as exc:
        raise ToolError(f"{exc}; pass a compute capability like sm_90 or 9.0, a family like hopper, or omit arch") from exc
    with ctx.store.read() as view:
        state = view.get_state(req.state_id)
        if state is None:
            raise _unknown_state(view, req.state_id)
        pool = view.candidates(state.id, family, req.track)
        picked = select_top_k(pool, req.k, req.temperature, req.seed, exclude=req.exclude)
        suggestions = [s for s in (_suggestion(view, state, score) for score in picked) if s is not None]
    return Result(
        state_id=state.id,
        state_name=state.name,
        bottleneck=state.signature.key,
        arch=family,
        track=req.track,
        candidates=len(pool),
        suggestions=suggestions,
    )
