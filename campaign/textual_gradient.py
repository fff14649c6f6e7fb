"""The textual-gradient update: PolicyEvaluation -> PerfGapAnalysis -> ParameterUpdate -> KB edits.

Every U recorded outcomes, three LLM roles read the replay buffer against the KB's predictions,
explain the gaps, and propose typed edits (`policy.kb_edits`). The edits are validated and the
valid ones applied in ONE KB transaction: either all of them land or none, and an invalid edit is
rejected with its reason without touching the KB. Numeric score updates do not wait for this:
they happen after every outcome (`record_outcome`), with or without an LLM.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kb_mcp.campaign.agent_base import AgentFailed, Conversation
from kb_mcp.campaign.agent_gradient import (
    ANALYZE_SYSTEM,
    EVALUATE_SYSTEM,
    UPDATE_SYSTEM,
    PredictionRow,
    analysis_request,
    evaluation_request,
    parse_analysis,
    parse_evaluation,
    parse_update,
    update_request,
)
from kb_mcp.campaign.models import GradientRecord
from kb_mcp.clients.llm import LLMClient, Role
from kb_mcp.kb import ids
from kb_mcp.kb.matching import discover_state
from kb_mcp.kb.models import ALL_ARCH, Lesson, Optimization, Outcome, Score, Verdict
from kb_mcp.kb.provenance import lesson_may_replace, outcome_is_verified, quote, shown_lessons
from kb_mcp.kb.store import KBStore
from kb_mcp.kb.view import KBView, Transaction
from kb_mcp.policy.kb_edits import (
    AddLesson,
    AddOptimization,
    AddState,
    AdjustPrior,
    DeprecateOptimization,
    KBEdit,
    RejectedEdit,
    ReviseOptimization,
    new_optimization_id,
    new_state_signature,
    parse_edits,
    validate_edits,
)

NO_LLM_NOTE = "no LLM configured: numeric KB updates only (textual gradient skipped)"
_LESSONS_SHOWN = 3


def prediction_rows(outcomes: Sequence[Outcome], predicted: Mapping[tuple[str, str],
                                                                    float | None]) -> list[PredictionRow]:
    """Groups a batch by (state, optimization): the prediction beside what was measured."""
    groups: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        groups[(outcome.state_id, outcome.optimization_id)].append(outcome)
    rows = []
    for (state_id, opt_id), group in sorted(groups.items()):
        speedups = [o.speedup for o in group if o.verdict.is_valid and o.speedup and o.speedup > 0]
        rows.append(
            PredictionRow(
                state_id=state_id,
                optimization_id=opt_id,
                predicted_speedup=predicted.get((state_id, opt_id)),
                outcomes=len(group),
                valid=sum(1 for o in group if o.verdict.is_valid),
                faster=sum(1 for o in group if o.verdict.is_valid and (o.speedup or 0) > 1),
                compile_errors=sum(1 for o in group if o.verdict == Verdict.compile_error),
                verify_failures=sum(1 for o in group if o.verdict in (Verdict.incorrect, Verdict.invalid)),
                measured_geomean=math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None,
            )
        )
    return rows


def outcome_details(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """What the analysis reads about each outcome (kept short: verdict, speedup, the recorded analysis)."""
    return [
        {
            "outcome_id": o.id,
            "problem": o.problem,
            "state_id": o.state_id,
            "optimization_id": o.optimization_id,
            "verdict": o.verdict.value,
            "verified": outcome_is_verified(o),
            "speedup_over_parent": o.speedup,
            "next_state_id": o.next_state_id,
            # what the recording agent wrote: data about the kernel, quoted with its provenance
            "notes": quote(o.analysis[:800], author=o.agent, source="agent", outcome_id=o.id) if o.analysis else "",
        }
        for o in outcomes
    ]


def kb_excerpt(view: KBView, outcomes: Sequence[Outcome], arch: str = ALL_ARCH) -> dict[str, Any]:
    """The part of the KB the update may edit: the batch's states and their optimizations."""
    state_ids = sorted({o.state_id for o in outcomes})
    pairs = sorted({(o.state_id, o.optimization_id) for o in outcomes})
    states = [s for s in (view.get_state(i) for i in state_ids) if s is not None]
    scores: list[dict[str, Any]] = []
    for state_id, opt_id in pairs:
        score = view.get_score(state_id, opt_id, arch) or view.get_score(state_id, opt_id, ALL_ARCH)
        opt = view.get_optimization(opt_id)
        scores.append(
            {
                "state_id": state_id,
                "optimization_id": opt_id,
                "optimization": None if opt is None else {"name": opt.name, "description": opt.description[:400]},
                "expected_speedup": None if score is None else round(score.expected_speedup, 3),
                "confidence": None if score is None else round(score.confidence, 3),
                "samples": 0 if score is None else score.samples,
                "attempts": 0 if score is None else score.attempts,
                "lessons": [
                    quote(x.text, author=x.author, source=x.source, outcome_id=x.outcome_id)
                    for x in shown_lessons(view, state_id, opt_id, _LESSONS_SHOWN)
                ],
            }
        )
    return {
        "states": [{"id": s.id, "name": s.name, "signature": s.signature.key} for s in states],
        "all_state_ids": view.state_ids(),
        "optimizations_applicable": {
            s.id: [c.optimization_id for c in view.candidates(s.id, ALL_ARCH)] for s in states
        },
        "batch_scores": scores,
    }


# -- applying edits ---------------------------------------------------------------------------------


def _adjust_prior(tx: Transaction, edit: AdjustPrior, author: str) -> None:
    score = tx.get_score(edit.state_id, edit.optimization_id, edit.arch)
    if score is None:  # the optimization becomes applicable in that state, as a pure prior
        score = Score(state_id=edit.state_id, optimization_id=edit.optimization_id, arch=edit.arch)
    update: dict[str, Any] = {"prior_mean_log_speedup": math.log(edit.expected_speedup)}
    if edit.weight is not None:
        update["prior_weight"] = edit.weight
    tx.put_score(score.model_copy(update=update))


def _add_lesson(tx: Transaction, edit: AddLesson, author: str) -> None:
    lesson = Lesson(
        id=ids.lesson_id(edit.state_id, edit.optimization_id, edit.text),
        state_id=edit.state_id,
        optimization_id=edit.optimization_id,
        arch=edit.arch,
        text=edit.text,
        source="textual_gradient",
        author=author,
        outcome_id=edit.outcome_id,
    )
    if lesson_may_replace(tx, lesson):  # a shown lesson of the same text stays as it is
        tx.put_lesson(lesson)


def _add_optimization(tx: Transaction, edit: AddOptimization, author: str) -> None:
    opt_id = new_optimization_id(edit.name)
    tx.put_optimization(
        Optimization(
            id=opt_id,
            name=edit.name,
            description=edit.description,
            category=edit.category,
            when_helps=edit.when_helps,
            cost=edit.cost,
            applicable_states=list(edit.applicable_states),
            origin="campaign",
            author=author,
            outcome_id=edit.outcome_id,
        )
    )
    for state_id in edit.applicable_states:
        tx.put_score(
            Score(
                state_id=state_id,
                optimization_id=opt_id,
                prior_mean_log_speedup=math.log(edit.expected_speedup),
            )
        )


def _deprecate(tx: Transaction, edit: DeprecateOptimization, author: str) -> None:
    opt = tx.get_optimization(edit.optimization_id)
    assert opt is not None  # validated in this same transaction
    tx.put_optimization(opt.model_copy(update={"deprecated": True}))


def _revise(tx: Transaction, edit: ReviseOptimization, author: str) -> None:
    opt = tx.get_optimization(edit.optimization_id)
    assert opt is not None
    changes: dict[str, Any] = {
        k: v for k, v in (("description", edit.description), ("when_helps", edit.when_helps),
                          ("cost", edit.cost)) if v is not None
    }
    # the text is now the campaign's: shown to other agents only with a verified outcome behind it
    changes.update(author=author, outcome_id=edit.outcome_id)
    tx.put_optimization(opt.model_copy(update=changes))


def _add_state(tx: Transaction, edit: AddState, author: str) -> None:
    # discover_state adds the state once, inheriting its nearest state's optimizations as priors
    discover_state(tx, new_state_signature(edit), name=edit.name, description=edit.description)


_APPLY: dict[type, Callable[[Transaction, Any, str], None]] = {
    AdjustPrior: _adjust_prior,
    AddLesson: _add_lesson,
    AddOptimization: _add_optimization,
    DeprecateOptimization: _deprecate,
    ReviseOptimization: _revise,
    AddState: _add_state,
}


def apply_edits(store: KBStore, edits: Sequence[KBEdit], *,
                author: str = "campaign") -> tuple[list[KBEdit], list[RejectedEdit]]:
    """Validates `edits` against the KB and applies the valid ones, all in one transaction.

    If applying raises, the transaction writes nothing: the KB is never left half-edited.
    """
    with store.transaction() as tx:
        accepted, rejected = validate_edits(tx, list(edits))
        for edit in accepted:
            _APPLY[type(edit)](tx, edit, author)
    return accepted, rejected


def run_textual_gradient(
    llm: LLMClient | None,
    store: KBStore,
    outcomes: Sequence[Outcome],
    predicted: Mapping[tuple[str, str], float | None],
    *,
    index: int = 0,
    step_keys: Sequence[str] = (),
    arch: str = ALL_ARCH,
    answer_retries: int = 2,
    author: str = "campaign",
) -> GradientRecord:
    """One textual-gradient batch over `outcomes`; returns what each role said and what was applied.

    Without an LLM nothing is asked and nothing edited (the record says so). A role that gives
    no usable answer ends the batch with an error and no edits; an unreachable endpoint raises
    LLMError to the caller (the campaign stops and can be resumed).
    """
    record = GradientRecord(index=index, step_keys=list(step_keys))
    if llm is None:
        record.error = NO_LLM_NOTE
        return record
    if not outcomes:
        record.error = "no outcomes in the batch"
        return record
    ledger = record.tokens

    def talk(role: Role, system: str) -> Conversation:
        return Conversation(llm, role, system, ledger=ledger, answer_retries=answer_retries)

    try:
        record.evaluation = talk(Role.evaluate, EVALUATE_SYSTEM).ask(
            evaluation_request(prediction_rows(outcomes, predicted)), parse_evaluation
        )
        record.analysis = talk(Role.analyze, ANALYZE_SYSTEM).ask(
            analysis_request(record.evaluation, outcome_details(outcomes)), parse_analysis
        )
        with store.read() as view:
            excerpt = kb_excerpt(view, outcomes, arch)
        record.update = talk(Role.update, UPDATE_SYSTEM).ask(update_request(record.analysis, excerpt), parse_update)
    except AgentFailed as exc:
        record.error = str(exc)
        return record
    edits, malformed = parse_edits(record.update.edits)
    applied, rejected = apply_edits(store, edits, author=author)
    record.applied = [e.model_dump(mode="json") for e in applied]
    record.rejected = malformed + rejected
    return record

