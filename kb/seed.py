"""The seed KB shipped with kb-mcp: states (`seed/states.json`), optimizations with prior
scores (`seed/optimizations.json`) and lessons (`seed/lessons.json`).

An optimization entry in the seed file is an `Optimization` whose applicable states come with
the speedup we expect there before any measurement: ``"priors": {"state_id": 1.3, ...}``. Each
becomes a prior Score (``prior=True``) with mean log-speedup ``log(1.3)`` and a small weight, so
the first few real outcomes outweigh it.

A seed lesson names a state and an optimization that applies there, with text short enough to be
shown whole (`SEED_LESSON_CHARS`); it is trusted text (`kb.provenance`), shown from the start.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from kb_mcp.kb import ids
from kb_mcp.kb.models import ALL_ARCH, Lesson, Optimization, Score, State, utcnow
from kb_mcp.kb.ops import PutRecord
from kb_mcp.kb.tables import Tables, score_op

SEED_DIR = Path(__file__).resolve().parent / "seed"
SEED_PRIOR_WEIGHT = 1.0
"""Pseudo-samples a seed prior counts for: one measured outcome already weighs as much."""
SEED_LESSON_CHARS = 300
"""The longest seed lesson: suggestions show this much of a lesson."""


class SeedError(ValueError):
    """The shipped seed files are inconsistent (a bug in the package, caught by the tests)."""


def _read(name: str) -> Any:
    return json.loads((SEED_DIR / name).read_text())


@lru_cache(maxsize=1)
def _load() -> tuple[tuple[State, ...], tuple[Optimization, ...], tuple[tuple[str, str, float], ...]]:
    states = tuple(State.model_validate({**d, "origin": "seed"}) for d in _read("states.json"))
    state_ids = {s.id for s in states}
    if len(state_ids) != len(states):
        raise SeedError("duplicate state ids in seed/states.json")
    opts: list[Optimization] = []
    priors: list[tuple[str, str, float]] = []
    for entry in _read("optimizations.json"):
        entry = dict(entry)
        entry_priors: dict[str, float] = entry.pop("priors")
        opt = Optimization.model_validate({**entry, "applicable_states": list(entry_priors), "origin": "seed"})
        for state_id, speedup in entry_priors.items():
            if state_id not in state_ids:
                raise SeedError(f"optimization {opt.id}: unknown state {state_id!r}")
            if not 0.2 <= speedup <= 20:
                raise SeedError(f"optimization {opt.id}: implausible prior speedup {speedup} in {state_id}")
            priors.append((state_id, opt.id, speedup))
        opts.append(opt)
    opt_ids = {o.id for o in opts}
    if len(opt_ids) != len(opts):
        raise SeedError("duplicate optimization ids in seed/optimizations.json")
    for opt in opts:
        unknown = [f for f in opt.follow_ups if f not in opt_ids]
        if unknown:
            raise SeedError(f"optimization {opt.id}: unknown follow-ups {unknown}")
    return states, tuple(opts), tuple(priors)


@lru_cache(maxsize=1)
def _lessons() -> tuple[Lesson, ...]:
    opts = _load()[1]
    applies = {(s, o.id) for o in opts for s in o.applicable_states}
    out = []
    for entry in _read("lessons.json"):
        state_id, opt_id, text = entry["state_id"], entry["optimization_id"], " ".join(entry["text"].split())
        if (state_id, opt_id) not in applies:
            raise SeedError(f"seed lesson for {opt_id!r} in {state_id!r}: the optimization does not apply there")
        if len(text) > SEED_LESSON_CHARS:
            raise SeedError(f"seed lesson for {opt_id!r} in {state_id!r} is longer than {SEED_LESSON_CHARS} characters")
        out.append(Lesson(id=ids.lesson_id(state_id, opt_id, text), state_id=state_id, optimization_id=opt_id,
                          text=text, source="seed"))
    return tuple(out)


def seed_states() -> list[State]:
    """The seed states."""
    return list(_load()[0])


def seed_optimizations() -> list[Optimization]:
    """The seed optimizations."""
    return list(_load()[1])


def seed_scores() -> list[Score]:
    """Prior scores (pooled over all archs) for every (state, optimization) pair the seed links."""
    return [
        Score(
            state_id=state_id,
            optimization_id=opt_id,
            arch=ALL_ARCH,
            prior=True,
            prior_mean_log_speedup=math.log(speedup),
            prior_weight=SEED_PRIOR_WEIGHT,
        )
        for state_id, opt_id, speedup in _load()[2]
    ]


def seed_lessons() -> list[Lesson]:
    """The seed lessons (pooled over all archs)."""
    return list(_lessons())


def seed_tables() -> Tables:
    """Fresh tables holding the seed KB (the store adds the meta record)."""
    tables = Tables()
    now = utcnow()
    for state in seed_states():
        tables.apply(PutRecord("states", state.id,
                               state.model_copy(update={"created_at": now}).model_dump(mode="json")))
    for opt in seed_optimizations():
        tables.apply(PutRecord("optimizations", opt.id,
                               opt.model_copy(update={"created_at": now}).model_dump(mode="json")))
    for lesson in seed_lessons():
        tables.apply(PutRecord("lessons", lesson.id,
                               lesson.model_copy(update={"created_at": now}).model_dump(mode="json")))
    stamp = now.isoformat()
    for score in seed_scores():
        tables.apply(score_op(score.model_copy(update={"updated_at": now}), stamp))
    return tables
