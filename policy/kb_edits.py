"""Typed KB edits proposed by the textual-gradient update, and their validation.

The ParameterUpdate agent answers with a list of edits; each is parsed on its own (one malformed
edit does not discard the others) and checked against the KB as it is: ids must exist, names must
be new, numbers must be in range, a bottleneck pair must be consistent. Edits that pass are applied
together in one KB transaction (`policy.textual_gradient`); the others come back with a reason.

Measured statistics are never edited: scores move only on the server's own verdicts. What an edit
can move is a score's *prior* (the expectation before measurements, and how many pseudo-samples it
counts for), so LLM judgement shifts exploration without overwriting evidence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from kb_mcp.harness.profile_model import KernelMetrics
from kb_mcp.kb import ids
from kb_mcp.kb.models import ALL_ARCH, SECONDARY_OF, MetricRange, Primary, Secondary, Signature
from kb_mcp.kb.view import KBView

MIN_PRIOR_SPEEDUP = 0.25
MAX_PRIOR_SPEEDUP = 4.0
MAX_PRIOR_WEIGHT = 2.0
"""The most pseudo-samples an edited prior may count for (before the selection's calibration): the
measurements of a few outcomes always outweigh what an LLM believes."""
MAX_PRIOR_MOVE = math.log(2.0)
"""How far (log units) one edit may move a prior mean: x2 either way per textual-gradient update."""
MAX_EDITS_PER_UPDATE = 24
CATEGORIES = ("memory_access", "parallelism", "fusion", "compute", "occupancy", "launch", "algorithm", "precision")

_Text = Annotated[str, Field(min_length=1, max_length=2000)]
_Name = Annotated[str, Field(min_length=3, max_length=80)]


class _Edit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(min_length=10, max_length=1000)]  # why: the evidence from the batch


class AdjustPrior(_Edit):
    """Moves the prior expectation of one optimization in one state (never the measured statistics)."""

    kind: Literal["adjust_prior"] = "adjust_prior"
    state_id: str
    optimization_id: str
    arch: str = ALL_ARCH
    expected_speedup: float = Field(ge=MIN_PRIOR_SPEEDUP, le=MAX_PRIOR_SPEEDUP)
    weight: float | None = Field(default=None, gt=0.0, le=MAX_PRIOR_WEIGHT)


class AddLesson(_Edit):
    """A lesson learned about an optimization in a state.

    `outcome_id` names the verified outcome (of the same state and optimization) it was learned
    from; without one the lesson is kept, but never shown to other agents (`kb.provenance`)."""

    kind: Literal["add_lesson"] = "add_lesson"
    state_id: str
    optimization_id: str
    arch: str = ALL_ARCH
    text: Annotated[str, Field(min_length=20, max_length=1200)]
    outcome_id: str | None = None


class AddOptimization(_Edit):
    """A new optimization seen to work (or promising) in the listed states."""

    kind: Literal["add_optimization"] = "add_optimization"
    name: _Name
    description: Annotated[str, Field(min_length=40, max_length=2000)]
    category: str
    when_helps: str = ""
    cost: str = ""
    applicable_states: list[str] = Field(min_length=1)
    expected_speedup: float = Field(default=1.1, ge=MIN_PRIOR_SPEEDUP, le=MAX_PRIOR_SPEEDUP)
    outcome_id: str | None = None  # the verified outcome (in one of those states) that shows it; else never shown


class DeprecateOptimization(_Edit):
    """Retires an optimization that keeps failing (it stays in the KB for history, but is not suggested)."""

    kind: Literal["deprecate_optimization"] = "deprecate_optimization"
    optimization_id: str


class ReviseOptimization(_Edit):
    """Rewrites the text of an optimization (what to do, when it helps, what it costs)."""

    kind: Literal["revise_optimization"] = "revise_optimization"
    optimization_id: str
    description: Annotated[str, Field(min_length=40, max_length=2000)] | None = None
    when_helps: _Text | None = None
    cost: _Text | None = None
    outcome_id: str | None = None  # the verified outcome of this optimization behind the new text; else never shown


class AddState(_Edit):
    """A performance state the KB lacks; it inherits the optimizations of its nearest state (`kb.matching`)."""

    kind: Literal["add_state"] = "add_state"
    name: _Name
    description: Annotated[str, Field(min_length=40, max_length=2000)]
    primary: Primary
    secondary: Secondary | None = None
    ranges: list[MetricRange] = Field(default_factory=list)


KBEdit = Annotated[
    AdjustPrior | AddLesson | AddOptimization | DeprecateOptimization | ReviseOptimization | AddState,
    Field(discriminator="kind"),
]
_EDIT_ADAPTER: TypeAdapter[Any] = TypeAdapter(KBEdit)
EDIT_KINDS = ("adjust_prior", "add_lesson", "add_optimization", "deprecate_optimization", "revise_optimization",
              "add_state")


class RejectedEdit(BaseModel):
    """An edit that was not applied, and why."""

    model_config = ConfigDict(extra="forbid")

    edit: dict[str, Any]
    reason: str


def parse_edits(items: Iterable[Any]) -> tuple[list[KBEdit], list[RejectedEdit]]:
    """Parses each raw edit on its own; malformed ones are rejected with the validator's reason."""
    edits: list[KBEdit] = []
    rejected: list[RejectedEdit] = []
    for index, item in enumerate(items):
        raw = item if isinstance(item, dict) else {"value": item}
        if index >= MAX_EDITS_PER_UPDATE:
            rejected.append(RejectedEdit(edit=raw, reason=f"more than {MAX_EDITS_PER_UPDATE} edits in one update"))
            continue
        if raw.get("kind") not in EDIT_KINDS:
            rejected.append(RejectedEdit(edit=raw,
                                         reason=f"unknown kind {raw.get('kind')!r}; kinds: {', '.join(EDIT_KINDS)}"))
            continue
        try:
            edits.append(_EDIT_ADAPTER.validate_python(raw))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'][1:]) or 'edit'}: {err['msg']}" for err in exc.errors()
            )
            rejected.append(RejectedEdit(edit=raw, reason=problems))
    return edits, rejected


CANONICAL_METRICS = frozenset(KernelMetrics.model_fields) - {"warp_stalls", "occupancy_limiter"}


def new_optimization_id(name: str) -> str:
    """Id of an optimization added by name (the same id `record_outcome` gives an agent's new one)."""
    return ids.agent_optimization_id(name)


def new_state_signature(edit: AddState) -> Signature:
    """The signature a new state is recognised by."""
    return Signature(primary=edit.primary, secondary=edit.secondary, ranges=edit.ranges)


def _measured(view: KBView, state_id: str, optimization_id: str) -> tuple[int, float]:
    """(samples, mean log-speedup) measured for one pair, pooled over arches."""
    score = view.get_score(state_id, optimization_id, ALL_ARCH)
    return (score.samples, score.mean_log_speedup) if score is not None else (0, 0.0)


@dataclass
class _Batch:
    """What the KB holds, plus what the edits accepted so far in this batch add to it."""

    state_ids: set[str]
    opt_ids: set[str]
    opt_names: set[str]
    deprecated: set[str]
    new_keys: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, view: KBView) -> _Batch:
        optimizations = view.list_optimizations()
        return cls(
            state_ids=set(view.state_ids()),
            opt_ids={o.id for o in optimizations},
            opt_names={o.name.lower() for o in optimizations},
            deprecated={o.id for o in optimizations if o.deprecated},
        )


def validate_edits(view: KBView, edits: list[KBEdit]) -> tuple[list[KBEdit], list[RejectedEdit]]:
    """Checks each edit against the KB (and the edits accepted before it in the same batch).

    Call it inside the transaction that applies the accepted edits, so nothing changes between
    checking and applying.
    """
    batch = _Batch.of(view)
    accepted: list[KBEdit] = []
    rejected: list[RejectedEdit] = []
    for edit in edits:
        reason = _problem_with(view, batch, edit)
        if reason is None:
            accepted.append(edit)
        else:
            rejected.append(RejectedEdit(edit=edit.model_dump(mode="json"), reason=reason))
    return accepted, rejected


def _problem_with(view: KBView, batch: _Batch, edit: KBEdit) -> str | None:
    """Why `edit` is refused (None: accepted, and `batch` now includes it)."""
    if isinstance(edit, (AdjustPrior, AddLesson)):
        return _check_pair_edit(view, batch, edit)
    if isinstance(edit, AddOptimization):
        return _check_add_optimization(view, batch, edit)
    if isinstance(edit, DeprecateOptimization):
        return _check_deprecation(view, batch, edit)
    if isinstance(edit, ReviseOptimization):
        if edit.optimization_id not in batch.opt_ids:
            return f"unknown optimization {edit.optimization_id!r}"
        if edit.description is None and edit.when_helps is None and edit.cost is None:
            return "nothing to revise: give description, when_helps or cost"
        return _check_outcome(view, edit.outcome_id, optimization_id=edit.optimization_id)
    return _check_add_state(view, batch, edit)


def _check_outcome(
    view: KBView, outcome_id: str | None, *, optimization_id: str | None = None, state_ids: Sequence[str] = ()
) -> str | None:
    """Why the outcome an edit cites cannot back it (None: it can, or none is cited)."""
    if outcome_id is None:
        return None
    outcome = view.get_outcome(outcome_id)
    if outcome is None:
        return f"unknown outcome {outcome_id!r}: cite an outcome_id of the batch"
    if optimization_id is not None and outcome.optimization_id != optimization_id:
        return f"outcome {outcome_id} applied {outcome.optimization_id!r}, not {optimization_id!r}"
    if state_ids and outcome.state_id not in state_ids:
        return f"outcome {outcome_id} is in state {outcome.state_id!r}, not one of {', '.join(state_ids)}"
    return None


def _check_pair_edit(view: KBView, batch: _Batch, edit: AdjustPrior | AddLesson) -> str | None:
    if edit.state_id not in batch.state_ids:
        return f"unknown state {edit.state_id!r}"
    if edit.optimization_id not in batch.opt_ids:
        return f"unknown optimization {edit.optimization_id!r}"
    if isinstance(edit, AddLesson):
        return _check_outcome(view, edit.outcome_id, optimization_id=edit.optimization_id, state_ids=[edit.state_id])
    samples, mean = _measured(view, edit.state_id, edit.optimization_id)
    wanted = math.log(edit.expected_speedup)
    # A prior pointing the other way from three or more measurements contradicts the evidence.
    if samples >= 3 and wanted * mean < 0 and abs(mean) > 0.05:
        return f"contradicts {samples} measurements (measured mean {math.exp(mean):.2f}x)"
    score = view.get_score(edit.state_id, edit.optimization_id, edit.arch) or view.get_score(
        edit.state_id, edit.optimization_id, ALL_ARCH
    )
    current = score.prior_mean_log_speedup if score is not None else 0.0
    if abs(wanted - current) > MAX_PRIOR_MOVE + 1e-9:
        lo, hi = math.exp(current - MAX_PRIOR_MOVE), math.exp(current + MAX_PRIOR_MOVE)
        return (
            f"moves the prior from {math.exp(current):.2f}x to {edit.expected_speedup:.2f}x; one update may move it "
            f"within {lo:.2f}x..{hi:.2f}x (measurements, not edits, move a score further)"
        )
    return None


def _check_add_optimization(view: KBView, batch: _Batch, edit: AddOptimization) -> str | None:
    new_id = new_optimization_id(edit.name)
    if new_id in batch.opt_ids or edit.name.lower() in batch.opt_names:
        return f"an optimization named {edit.name!r} (id {new_id!r}) already exists"
    missing = [s for s in edit.applicable_states if s not in batch.state_ids]
    if missing:
        return f"unknown applicable states: {', '.join(missing)}"
    if edit.category not in CATEGORIES:
        return f"category {edit.category!r} is not one of {', '.join(CATEGORIES)}"
    if abs(math.log(edit.expected_speedup)) > MAX_PRIOR_MOVE + 1e-9:
        return ("a new optimization's prior must lie within "
                f"{math.exp(-MAX_PRIOR_MOVE):.2f}x..{math.exp(MAX_PRIOR_MOVE):.2f}x")
    cited = _check_outcome(view, edit.outcome_id, state_ids=edit.applicable_states)
    if cited is not None:
        return cited
    batch.opt_ids.add(new_id)
    batch.opt_names.add(edit.name.lower())
    return None


def _check_deprecation(view: KBView, batch: _Batch, edit: DeprecateOptimization) -> str | None:
    if edit.optimization_id not in batch.opt_ids:
        return f"unknown optimization {edit.optimization_id!r}"
    if edit.optimization_id in batch.deprecated:
        return f"{edit.optimization_id!r} is already deprecated"
    helped = sorted(
        sid for sid in batch.state_ids if (m := _measured(view, sid, edit.optimization_id))[0] >= 2 and m[1] > 0.05
    )
    if helped:
        return f"measured gains in {', '.join(helped)} contradict deprecating it"
    batch.deprecated.add(edit.optimization_id)
    return None


def _check_add_state(view: KBView, batch: _Batch, edit: AddState) -> str | None:
    if edit.secondary is not None and SECONDARY_OF[edit.secondary] != edit.primary:
        return (
            f"secondary {edit.secondary.value!r} belongs to primary "
            f"{SECONDARY_OF[edit.secondary].value!r}, not {edit.primary.value!r}"
        )
    unknown = sorted({r.metric for r in edit.ranges} - CANONICAL_METRICS)
    if unknown:
        return f"unknown metrics in ranges: {', '.join(unknown)}"
    empty = [r.metric for r in edit.ranges if r.min is not None and r.max is not None and r.min > r.max]
    if empty:
        return f"empty ranges (min > max): {', '.join(empty)}"
    signature = new_state_signature(edit)
    taken = view.states_with_key(signature.key)
    if taken or signature.key in batch.new_keys:
        owner = taken[0].id if taken else "an earlier edit"
        return f"signature {signature.key} is already the state {owner}; add a lesson there instead"
    batch.state_ids.add(ids.discovered_state_id(signature))
    batch.new_keys.add(signature.key)
    return None
