"""MCP tool `record_outcome`: credit an optimization with the server's own verdict on a candidate."""

from __future__ import annotations

import difflib
import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kb_mcp.kb import ids
from kb_mcp.kb.arch import arch_family
from kb_mcp.kb.models import (
    ALL_ARCH,
    DEFAULT_TRACK,
    CandidateRecord,
    Lesson,
    Optimization,
    Outcome,
    Score,
    Strength,
    Track,
    Verdict,
)
from kb_mcp.kb.provenance import lesson_may_replace, optimization_is_verified, outcome_is_verified
from kb_mcp.kb.view import KBView, Transaction
from kb_mcp.policy import credit
from kb_mcp.policy.credit import Credit, CreditBasis, CreditRule, Lineage
from kb_mcp.policy.lineage import start_of
from kb_mcp.policy.select import CalibrationSums, calibrate, influence_band
from kb_mcp.policy.update import (
    MAX_CREDITED_SPEEDUP,
    apply_outcome,
    counts_toward_score,
    credited_log_speedup,
    detected_log_speedup,
    track_alarm_after,
    track_alarmed,
)
from kb_mcp.tools import candidate_store
from kb_mcp.tools.base import Progress, ToolError, ToolMeta, no_progress
from kb_mcp.tools.context import ToolContext

NAME = "record_outcome"
DESCRIPTION = f"""\
Record what an optimization did, so the shared Knowledge Base learns from it. Call it after
compile_and_verify, once per candidate, with: the state id the kernel was in (from classify_state),
the optimization you applied (its id from suggest_optimizations, or - for an idea of your own - a
new_optimization with a name and a specific description of the code change), the candidate_id
that your compile_and_verify returned (record.candidate_id; only a client that verified a candidate
may record it), and ideally the parent_candidate_id you started from (a candidate checked on this KB;
the speedup is then measured against it - it must be verified before, on the same GPU; otherwise
against eager PyTorch) and the next state id if you profiled the new kernel (the KB
learns what each optimization turns a kernel into). A kernel slower than the problem's reference is
a fine parent: its lineage is credited with its own improvement, counted from the fastest kernel
recorded on its way from its first kernel; a first kernel more than {credit.START_ALLOWANCE:g}x slower
than the reference weighs less, and what a slow start adds lifts a score only slowly. Record
failures too (compile errors, wrong results): they lower the optimization's score where it does
not work. The score moves only on the server's own stored verdict and timings for that candidate -
you cannot and need not report a speedup - only on a verdict checked with compile_and_verify's
default options (others are refused), and how far one outcome moves it is bounded. Explain in
`analysis` why it helped or not; add a one-sentence `lesson` for the next agent when you learned
something reusable (other agents see it, marked as untrusted KB content, only if this candidate
verified). One candidate credits one optimization in one state, once: the first outcome recorded
for it (by any client that verified it) holds its credit, and recording it for another optimization
or state is refused. A kernel combining several changes is credited to the main one (describe the
others in `analysis`); to credit each change, verify each as its own candidate. Recording the same
candidate and optimization twice changes nothing. Returns the updated entry: expected speedup,
confidence and counts."""

META = ToolMeta(
    title="Record a measured outcome in the KB",
    # one outcome per candidate (`KBView.credited_outcome`): recording it again changes nothing, recording
    # it for another optimization or state is refused
    idempotent=True,
)

MAX_TEXT = 2000
MAX_ID = 120
"""Longest id a request may name: candidate ids are `c_` and 16 hex digits (`harness.problem.candidate_id`),
state and optimization ids short slugs; an id is echoed in refusals and stored with the outcome."""


class NewOptimization(BaseModel):
    """An optimization the KB does not have yet, described by the agent that tried it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=3, max_length=120,
                      description="short imperative name, e.g. 'Cache row max in registers'")
    description: str = Field(min_length=20, max_length=MAX_TEXT, description="what to change in the code, specifically")
    category: str = Field("other", max_length=40,
                          description="e.g. memory_access, fusion, parallelism, compute, occupancy")
    when_helps: str = Field("", max_length=600, description="the situation in which it pays off")
    cost: str = Field("", max_length=600, description="complexity, resource cost, correctness risks")


class Request(BaseModel):
    """What was tried, and which verified candidate it produced."""

    model_config = ConfigDict(extra="forbid")

    state_id: str = Field(max_length=MAX_ID,
                          description="KB state the kernel was in before the change (from classify_state)")
    optimization_id: str | None = Field(None, max_length=MAX_ID,
                                        description="id of the applied optimization (from suggest_optimizations)")
    new_optimization: NewOptimization | None = Field(None, description="instead of optimization_id: your own idea")
    candidate_id: str = Field(max_length=MAX_ID,
                              description="the candidate_id your compile_and_verify returned for the changed kernel")
    parent_candidate_id: str | None = Field(
        None, max_length=MAX_ID,
        description="candidate_id of the kernel you started from (one compile_and_verify checked on this KB)",
    )
    next_state_id: str | None = Field(None, max_length=MAX_ID,
                                      description="state of the new kernel, if you profiled and classified it")
    analysis: str = Field("", max_length=MAX_TEXT, description="why it helped or not (kept in the replay buffer)")
    lesson: str | None = Field(None, max_length=600, description="one reusable sentence for the next agent (optional)")
    tokens: int = Field(0, ge=0, description="LLM tokens spent on this step, for accounting")

    @model_validator(mode="after")
    def _one_optimization(self) -> Request:
        if (self.optimization_id is None) == (self.new_optimization is None):
            raise ValueError("give exactly one of optimization_id and new_optimization")
        return self


class Result(BaseModel):
    """The KB entry after this outcome."""

    model_config = ConfigDict(extra="forbid")

    outcome_id: str
    recorded: bool = Field(description="False when this candidate was already recorded for this optimization (nothing "
                                       "changed)")
    optimization_id: str
    optimization_created: bool = False
    verdict: Verdict
    track: Track = Field(DEFAULT_TRACK,
                         description="precision track of the candidate's verdict: the scores this outcome moved")
    speedup: float | None = Field(description="server-measured speedup credited to the optimization")
    speedup_basis: CreditBasis | None = Field(
        None,
        description="parent; lineage_best (the parent was slower than a kernel before it on its lineage: the "
                    "speedup counts from that kernel); parent_capped (the parent was slower than the problem's "
                    "reference after its lineage had been faster: it counts as the reference); or eager",
    )
    credit_weight: float = Field(
        1.0, description="the fraction of one outcome the speedup counts for in the score (below 1: the kernel's "
                         "lineage started far slower than the problem's reference or its other first kernels)",
    )
    score_moved: bool
    note: str
    entry: Score = Field(description="the score on this GPU family and track after the update")
    expected_speedup: float
    confidence: float
    pooled_expected_speedup: float = Field(description="expected speedup pooled over all GPU families (same track)")


def ineligible(cand: CandidateRecord) -> str | None:
    """Why the candidate's strongest verdict cannot be recorded at all, or None when it can.

    Verdicts checked with anything but the default options (loosened, stricter, quick) are never
    credited: recording one would spend the (candidate, optimization) outcome on a verdict that
    cannot count, so the caller is told to verify with the defaults first.
    """
    if cand.strength not in (Strength.loosened, Strength.custom, Strength.quick):
        return None
    why = {
        Strength.loosened: f"it was checked with loosened options ({'; '.join(cand.loosened) or 'see options'}) and is "
                           "flagged",
        Strength.custom: "it was checked with other settings than the defaults",
        Strength.quick: "its measurement was shortened",
    }[cand.strength]
    opts = ", ".join(f"{k}={v}" for k, v in cand.options.items())
    return (
        f"candidate {cand.candidate_id} has no verdict record_outcome can credit: its strongest stored verdict "
        f"({cand.verdict.value}, {cand.strength.value}: {opts}) cannot move a score because {why}. Verify it with "
        "compile_and_verify's default options (leave `options` out), then record the outcome."
    )


def _measured_credit(
    view: KBView, cand: CandidateRecord, parent_id: str | None, client: str, rule: CreditRule = credit.SHIPPED
) -> tuple[Credit | None, str]:
    """The credit of this candidate's stored verdict (`policy.credit.credit`) against the parent named,
    read from the KB's own records, and what the caller should be told about it."""
    if not cand.verdict.is_valid or not cand.time_ms or cand.time_ms <= 0:
        return None, ""
    note, lineage = "", None
    if parent_id:
        # the parent's own creditable verdict on this candidate's GPU, whatever else is stored for it
        parent = next((p for p in view.candidate_verdicts(parent_id) if p.creditable and p.device == cand.device), None)
        if (parent is None or parent.problem_hash != cand.problem_hash or not parent.verdict.is_valid
                or not parent.time_ms or parent.device != cand.device):
            note = f"parent {parent_id} is not a verified candidate of the same problem timed on the same GPU; "
        elif parent.created_at > cand.created_at:
            note = f"parent {parent_id} was verified after this candidate, so it cannot be where it started; "
        elif parent.eager_ms:
            lineage = start_of(view, parent, client)
        else:  # no reference timing beside the parent: nothing says how slow it was
            lineage = Lineage(parent_ms=parent.time_ms, best_ms=parent.time_ms, root_ms=1.0, root_eager_ms=1.0)
        if lineage is None:
            note += "speedup is over eager PyTorch. "
    found = credit.credit(cand.time_ms, cand.eager_ms, lineage, rule)
    if found is None:
        return None, note + "no baseline timing stored for this candidate; counted as an attempt only. "
    if found.why:
        note += f"{found.why[0].upper()}{found.why[1:]}"
        note += f" (it counts as {found.weight:.2g} of one outcome). " if found.weight < 1 else ". "
    return found, note


def _resolve_optimization(tx: Transaction, req: Request, client: str) -> tuple[Optimization, bool]:
    if req.optimization_id is not None:
        opt = tx.get_optimization(req.optimization_id)
        if opt is None:
            close = difflib.get_close_matches(req.optimization_id, [o.id for o in tx.list_optimizations()], n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ToolError(
                f"unknown optimization_id {req.optimization_id!r}.{hint} Use an id from suggest_optimizations, "
                "or pass new_optimization with a name and description for an idea of your own."
            )
        return opt, False
    new = req.new_optimization
    assert new is not None
    oid = ids.agent_optimization_id(new.name)
    opt = tx.get_optimization(oid)
    if opt is not None:
        return opt, False  # the same name was recorded before: one optimization, more evidence
    return (
        Optimization(
            id=oid, name=new.name, description=new.description, category=new.category,
            when_helps=new.when_helps, cost=new.cost, applicable_states=[req.state_id], origin="agent",
            author=client, outcome_id=ids.outcome_id(req.candidate_id, oid),
        ),
        True,
    )


def _base_score(tx: Transaction, state_id: str, opt_id: str, arch: str, track: Track) -> Score:
    score = tx.get_score(state_id, opt_id, arch, track)
    if score is not None:
        return score
    # A first outcome on this family (or track) starts from the pooled prior of its track, else
    # from the strict track's: a prior is a belief about the optimization, not a measurement.
    pooled = tx.get_score(state_id, opt_id, ALL_ARCH, track) or tx.get_score(state_id, opt_id, ALL_ARCH, DEFAULT_TRACK)
    if pooled is not None:
        return Score(
            state_id=state_id, optimization_id=opt_id, arch=arch, track=track,
            prior_mean_log_speedup=pooled.prior_mean_log_speedup, prior_weight=pooled.prior_weight,
        )
    return Score(state_id=state_id, optimization_id=opt_id, arch=arch, track=track)


def run(ctx: ToolContext, req: Request, progress: Progress = no_progress, *,
        rule: CreditRule = credit.SHIPPED) -> Result:
    """Records the outcome in one transaction (see DESCRIPTION). `rule`: the credit's constants (the
    shipped ones; the learning simulator compares the rule before through this same code)."""
    with ctx.store.transaction() as tx:
        cand = _checked_candidate(tx, req, ctx.client_name)
        opt, created = _resolve_optimization(tx, req, ctx.client_name)
        family = arch_family(cand.arch)
        track = cand.track  # the verdict's own track: an outcome moves only that track's scores
        oid = ids.outcome_id(cand.candidate_id, opt.id)
        previous = tx.get_outcome(oid)
        if previous is not None:
            before, _ = _measured_credit(tx, cand, previous.parent_candidate_id, previous.agent, rule)
            return _result(tx, previous, before, recorded=False, created=False, moved=False,
                           note="already recorded: this candidate was credited to this optimization before (in "
                                f"state {previous.state_id!r}); nothing changed")
        holder = tx.credited_outcome(cand.candidate_id)
        if holder is not None:  # refused before anything is written: no score, transition, lesson or optimization
            raise ToolError(_already_credited(holder, opt.id, req.state_id))

        found, note = _measured_credit(tx, cand, req.parent_candidate_id, ctx.client_name, rule)
        speedup = found.speedup if found is not None else None
        moved = counts_toward_score(cand.verdict) and cand.creditable
        if moved and speedup is not None and not 1 / MAX_CREDITED_SPEEDUP <= speedup <= MAX_CREDITED_SPEEDUP:
            note += (f"one outcome moves a score by at most {MAX_CREDITED_SPEEDUP:g}x either way: the score counts "
                     f"{math.exp(credited_log_speedup(speedup)):.3g}x, the outcome keeps {speedup:.3g}x. ")
        if created:
            tx.put_optimization(opt)
        if tx.get_score(req.state_id, opt.id, ALL_ARCH) is None:
            tx.put_score(Score(state_id=req.state_id, optimization_id=opt.id))  # known here, even if unmeasured
        if moved:
            note += _move_scores(tx, req, cand, opt.id, found, ctx.client_name)
        note += _why_no_score_moved(cand, moved)
        outcome = Outcome(
            id=oid, problem=cand.problem, candidate_id=cand.candidate_id, parent_candidate_id=req.parent_candidate_id,
            state_id=req.state_id, next_state_id=req.next_state_id, optimization_id=opt.id, arch=family,
            track=track, mode=cand.mode, verdict=cand.verdict, speedup=speedup,
            speedup_vs_baseline=cand.speedup_vs_baseline,
            tokens=req.tokens,
            agent=ctx.client_name, analysis=req.analysis, flagged=cand.flagged,
        )
        tx.put_outcome(outcome)
        _keep_lesson(tx, req, outcome, ctx.client_name)
        if not created and opt.origin == "agent" and not optimization_is_verified(tx,
                                                                                  opt) and outcome_is_verified(outcome):
            # an agent-made optimization first recorded with a failure is vouched for by this verified outcome
            tx.put_optimization(opt.model_copy(update={"outcome_id": oid}))
        return _result(tx, outcome, found, recorded=True, created=created, moved=moved, note=note.strip() or "recorded")


def _already_credited(holder: Outcome, opt_id: str, state_id: str) -> str:
    """The refusal of a second (state, optimization) for a candidate whose credit `holder` holds."""
    other = f"optimization {opt_id!r}" + (f" in state {state_id!r}" if state_id != holder.state_id else "")
    return (
        f"candidate {holder.candidate_id} already credits optimization {holder.optimization_id!r} in state "
        f"{holder.state_id!r} (outcome {holder.id}, recorded by {holder.agent or 'an unnamed client'!r}): one "
        f"candidate's measurement moves the KB's scores once, so it cannot also credit {other}. A kernel that "
        "combines several changes is credited to one optimization: record the main change, and describe the "
        "others in `analysis`. To credit another change, verify a kernel with only that change as its own "
        "candidate (compile_and_verify) and record that one."
    )


def _checked_candidate(tx: Transaction, req: Request, client: str) -> CandidateRecord:
    """The stored verdict the request names, once the request is known to be one `client` can record."""
    cand = tx.own_candidate(req.candidate_id)
    merged = tx.get_candidate(req.candidate_id) if cand is None else None
    if merged is not None:
        raise ToolError(
            f"candidate {req.candidate_id}'s verdicts were merged in from another KB file ({merged.imported_from}): "
            "outcomes here are measured only from this server's own verdicts. Verify its source with "
            "compile_and_verify, then record the outcome."
        )
    if cand is None:
        raise ToolError(candidate_store.unknown_candidate(
            tx, req.candidate_id, client, "candidate_id",
            "only candidates checked by compile_and_verify on this KB can be recorded. Call compile_and_verify with "
            "the candidate source and use the candidate_id it returns."))
    if not tx.speaks_for(cand.candidate_id, client):
        on = f" on {cand.device}" if cand.device else ""
        raise ToolError(
            f"candidate {cand.candidate_id} was verified by another client, not by you ({client or 'unnamed'!r}): "
            "only a client whose compile_and_verify produced a candidate's strongest verdict (the one its outcomes "
            f"are measured from: {cand.strength.value}{on}) may record outcomes of it. Record your own candidates; "
            "to record this one, verify its source yourself with compile_and_verify first, with the default "
            "options" + (" on a GPU" if cand.device else "") + "."
        )
    if req.parent_candidate_id is not None and not tx.candidate_verdicts(req.parent_candidate_id):
        raise ToolError(candidate_store.unknown_candidate(
            tx, req.parent_candidate_id, client, "parent_candidate_id",
            "a parent must be a candidate compile_and_verify checked on this KB. Pass the candidate_id it returned "
            "for the kernel you started from, or omit it (the speedup is then measured over eager PyTorch)."))
    refusal = ineligible(cand)
    if refusal:
        raise ToolError(refusal)
    if tx.get_state(req.state_id) is None:
        close = difflib.get_close_matches(req.state_id, tx.state_ids(), n=3)
        raise ToolError(
            f"unknown state_id {req.state_id!r}" + (f"; did you mean {', '.join(close)}?" if close else "")
            + " Use the id classify_state returned."
        )
    if req.next_state_id is not None and tx.get_state(req.next_state_id) is None:
        raise ToolError(f"unknown next_state_id {req.next_state_id!r}: use the id classify_state returned, or "
                        "omit it")
    return cand


def _move_scores(tx: Transaction, req: Request, cand: CandidateRecord, opt_id: str, found: Credit | None,
                 client: str) -> str:
    """Applies the outcome to the arch family's score and the pooled one; returns what the note says of it."""
    note = ""
    family, track = arch_family(cand.arch), cand.track
    speedup = found.speedup if found is not None else None
    weight, trusted = (found.weight, found.trusted) if found is not None else (1.0, None)
    # the band one outcome may move a score within comes from the same calibrated posterior
    # the selection draws from (the state's scores on this family and track)
    cal = calibrate(tx.candidate_stats(req.state_id, family, track),
                    CalibrationSums(*tx.calibration_sums(track)))
    level = tx.track_alarm(track, family)
    alarmed = track_alarmed(level)
    for arch in dict.fromkeys((family, ALL_ARCH)):
        base = _base_score(tx, req.state_id, opt_id, arch, track)
        band = influence_band(base, cal)
        if arch == family and speedup is not None and speedup > 0 and cand.verdict.is_valid and weight >= 1:
            # the family's score says how surprising this outcome is (the pooled one mixes families)
            after = track_alarm_after(level, detected_log_speedup(speedup, band, trusted), band)
            if after != level:  # nothing is written while the track is quiet
                tx.set_track_alarm(track, family, after)
        if arch == ALL_ARCH and speedup is not None and speedup > 0:
            credited = math.exp(credited_log_speedup(speedup, base, band, trusted))
            if abs(math.log(credited / speedup)) > 1e-9:
                beyond = "" if trusted is None else (
                    f"; what it gained beyond its {trusted:.3g}x over the reference, from a slow start, only a "
                    "little above the estimate")
                note += (f"one outcome moves a score only so far (at most {MAX_CREDITED_SPEEDUP:g}x, and "
                         f"within a band around its estimate{beyond}): the pooled score counts {credited:.3g}x, "
                         f"the outcome keeps {speedup:.3g}x. ")
        tx.put_score(apply_outcome(base, cand.verdict, speedup, client=client, band=band, alarmed=alarmed,
                                   weight=weight, trusted=trusted))
    if req.next_state_id and cand.verdict.is_valid:
        tx.bump_transition(req.state_id, opt_id, req.next_state_id)
    return note


def _why_no_score_moved(cand: CandidateRecord, moved: bool) -> str:
    if cand.flagged and cand.attempt:
        return (f"the candidate is flagged for review (sandbox_attempt): {cand.attempt} It is kept in the replay "
                "buffer for the server's owner to see; no score moved. ")
    if cand.flagged:
        return ("the candidate's speedup is flagged for review (implausible): kept in the replay buffer, no score "
                "moved. ")
    if not moved and counts_toward_score(cand.verdict):
        return (f"verdict {cand.verdict.value} comes from a compile-only check, which reaches it less surely "
                "than a GPU run; no score moved. ")
    if not moved:
        return (f"verdict {cand.verdict.value} says nothing about the optimization (the kernel never ran); no "
                "score moved. ")
    return ""


def _keep_lesson(tx: Transaction, req: Request, outcome: Outcome, client: str) -> None:
    """The agent's one-sentence lesson, kept with the outcome it came from."""
    if not req.lesson or not req.lesson.strip():
        return
    text = req.lesson.strip()
    lesson = Lesson(
        id=ids.lesson_id(req.state_id, outcome.optimization_id, text), state_id=req.state_id,
        optimization_id=outcome.optimization_id, arch=outcome.arch, text=text, source="agent", author=client,
        candidate_id=outcome.candidate_id, outcome_id=outcome.id,
    )
    if lesson_may_replace(tx, lesson):  # the same text told before and shown stays its first author's
        tx.put_lesson(lesson)


def _result(
    view: KBView, outcome: Outcome, found: Credit | None, *, recorded: bool, created: bool,
    moved: bool, note: str,
) -> Result:
    state_id, opt_id, track = outcome.state_id, outcome.optimization_id, outcome.track
    pooled = view.get_score(state_id, opt_id, ALL_ARCH, track) or Score(state_id=state_id, optimization_id=opt_id,
                                                                        track=track)
    entry = view.get_score(state_id, opt_id, outcome.arch, track) or pooled
    timed = outcome.speedup is not None and found is not None
    return Result(
        outcome_id=outcome.id,
        recorded=recorded,
        optimization_id=opt_id,
        optimization_created=created,
        verdict=outcome.verdict,
        track=outcome.track,
        speedup=round(outcome.speedup, 4) if outcome.speedup is not None else None,
        speedup_basis=found.basis if timed and found is not None else None,
        credit_weight=round(found.weight, 4) if timed and found is not None else 1.0,
        score_moved=moved,
        note=note,
        entry=entry,
        expected_speedup=round(entry.expected_speedup, 4),
        confidence=round(entry.confidence, 4),
        pooled_expected_speedup=round(pooled.expected_speedup, 4),
    )
