"""Moving knowledge between KB files: export, import and merge (the reference implementation's JSON
shape is `kb.reference_kb`'s).

* `export_kb` writes the whole KB (journal folded in) as a standalone kb-mcp file; every export
  (the reference shape too) checks its destination with `export_destination` and writes it whole
  or not at all with `write_export`.
* `merge_kb` pools another kb-mcp file into the store. Statistics are pooled exactly (Welford's
  parallel combination), and history both files share is counted once: outcomes have
  deterministic ids, so the outcomes present in both files are taken out of the other file's
  scores before pooling. One candidate's measurement moves scores once (`kb.view.credit_holders`):
  the other file's outcomes of a candidate whose credit an outcome here or an earlier one there holds
  are left out (with their lessons), and taken out of that file's scores and moves as shared ones are.
  Records missing here (states, optimizations, lessons, outcomes,
  candidate verdicts) are added; records present in both keep this KB's version. A verdict added
  is marked with the file it came from (`CandidateRecord.imported_from`): shown, never measured from.
  The other file is untrusted as a whole: every record is validated against its model before
  anything is written, and one bad record refuses the file (`InterchangeError` naming it; this
  KB unchanged). Its scores are held within the bounds this KB's own updates keep (per client and
  in total, by the numeric rule), its priors within those of an imported reference prior, and its
  moves between states within what its outcomes made.

The numeric rule that turns outcomes into statistics belongs to `policy.update`; `kb` imports
nothing of ours above it, so `merge_kb` takes that rule as an argument (pass the module).
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kb_mcp.kb import jsontext
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.errors import KBCorruptError, KBNewerFormatError, storage_error
from kb_mcp.kb.files import mode_of
from kb_mcp.kb.models import (
    ALL_ARCH,
    CandidateRecord,
    Lesson,
    Optimization,
    Outcome,
    Score,
    State,
    Transition,
    Verdict,
)
from kb_mcp.kb.store import KBFileError, KBStore
from kb_mcp.kb.tables import FORMAT, Tables, decode_score
from kb_mcp.kb.view import Transaction, credit_holders

REFERENCE_WEIGHT_PER_CONFIDENCE = 4.0
"""A reference entry with confidence_score 1.0 counts as 4 pseudo-samples of prior."""
MAX_PRIOR_WEIGHT = REFERENCE_WEIGHT_PER_CONFIDENCE
"""The most pseudo-samples a prior brought in from another file counts for."""
SPEEDUP_RANGE = (0.05, 100.0)
"""The speedups another file may claim, as a prior or as a client's measured mean: beyond them a
claim is held at the edge. (One outcome credits at most 8x either way, `policy.update`.)"""
_LOG_RANGE = (math.log(SPEEDUP_RANGE[0]), math.log(SPEEDUP_RANGE[1]))


class InterchangeError(ValueError):
    """A file that cannot be imported, merged or written; the message names the file and why."""


class DestinationExists(InterchangeError):
    """The file to write exists and overwriting it was not allowed (`path` names it)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path}: exists; choose a new file name, or allow overwriting it")
        self.path = path


class ScoreRule(Protocol):
    """The numeric update rule (`kb_mcp.policy.update` satisfies it)."""

    def apply_outcome(
        self, score: Score, verdict: Verdict, speedup: float | None, when: datetime | None = None, *, client: str = ""
    ) -> Score: ...

    def merge_scores(self, a: Score, b: Score) -> Score: ...

    def subtract_scores(self, total: Score, part: Score) -> Score: ...

    def empty_like(self, score: Score) -> Score: ...

    def counts_toward_score(self, verdict: Verdict) -> bool: ...


class TransferReport(BaseModel):
    """What an import or merge changed."""

    model_config = ConfigDict(extra="forbid")

    source: str
    format: str  # kb-mcp | reference
    states_added: int = 0
    optimizations_added: int = 0
    scores_added: int = 0
    scores_pooled: int = 0
    outcomes_added: int = 0
    outcomes_shared: int = 0  # already here: counted once
    outcomes_left_out: int = 0  # of a candidate whose credit another outcome holds: not added, not counted
    lessons_added: int = 0
    transitions_added: int = 0  # counts added
    candidates_added: int = 0
    ignored: list[str] = Field(default_factory=list)  # fields or entries not carried over, with why


# ---- files -----------------------------------------------------------------------------------


def read_json(path: Path) -> Any:
    """Parses a JSON file, with errors that name it. NaN and Infinity (which Python's json reads
    by default) are refused: no KB record holds them, and one would spread into every sum."""
    try:
        return jsontext.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise InterchangeError(f"{path}: no such file") from exc
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError, and so is a NaN
        raise InterchangeError(f"{path}: not valid JSON ({exc})") from exc
    except OSError as exc:
        raise InterchangeError(f"{path}: cannot read: {exc}") from exc


def detect_format(data: Any) -> str:
    """'kb-mcp' for a kb-mcp KB file, 'reference' for the reference implementation's shape, else ''."""
    if isinstance(data, dict):
        meta = data.get("meta")
        if isinstance(meta, dict) and any(isinstance(m, dict) and m.get("format") == FORMAT for m in meta.values()):
            return "kb-mcp"
        if isinstance(data.get("optimization_strategies"), dict):
            return "reference"
    return ""


def load_kb_file(path: Path) -> Tables:
    """The tables of another kb-mcp KB file, its journal included, without locking or changing it."""
    p = Path(path)
    if not p.is_file():
        raise InterchangeError(f"{p}: no such file")
    try:
        other = KBStore(p)
        return other.refresh()
    except KBCorruptError as exc:
        # The advice for a damaged KB (restore it, start a new one) is for its own user, not for one
        # merging it: this KB is what matters here, and it is unchanged.
        raise _refused(str(p), "damaged", exc.message.removeprefix(f"{p}: ").rstrip(". ")) from exc
    except KBNewerFormatError:
        raise  # this machine's kb-mcp is to upgrade, as the error says: not the file's fault
    except KBFileError as exc:
        raise InterchangeError(str(exc)) from exc


def export_kb(store: KBStore, path: Path, *, overwrite: bool = False) -> Path:
    """Writes the whole KB to `path` as a standalone kb-mcp file (atomic); returns the path."""
    dest = export_destination(store, path, overwrite=overwrite)
    write_export(dest, jsontext.dumps(store.snapshot(), separators=(",", ":")))
    return dest


def export_destination(store: KBStore, path: Path, *, overwrite: bool = False) -> Path:
    """The file an export of `store` may write (resolved), or InterchangeError saying why not: the KB
    itself, a folder, or an existing file that overwriting was not allowed for (the caller's to change)."""
    dest = Path(path).expanduser().resolve()
    if dest == store.path.resolve():
        raise InterchangeError(f"{dest}: that is the KB being exported; choose another file")
    if dest.is_dir():
        raise InterchangeError(f"{dest}: is a directory; name the file to write (e.g. {dest / 'kb-export.json'})")
    if dest.exists() and not overwrite:
        raise DestinationExists(dest)
    return dest


def write_export(dest: Path, text: str) -> None:
    """Replaces `dest` with `text` whole or not at all (a temp file, fsynced, renamed over it), private
    like a new KB file; a write the machine refuses (disk full, permissions, a file size limit, a
    read-only file system) is a StorageError and leaves `dest` as it was."""
    mode, _ = mode_of(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(dest, text, mode=mode, fsync=True)
    except OSError as exc:
        raise storage_error(exc, "write the export", dest) from exc


# ---- merge -------------------------------------------------------------------------------------


def merge_kb(store: KBStore, source: Path | Tables, rule: ScoreRule, *, label: str | None = None) -> TransferReport:
    """Pools another kb-mcp KB into `store` in one transaction (see module doc).

    The other file is untrusted as a whole: every record is checked before anything is written,
    and one that breaks its model (a NaN, a negative weight, a string where a number belongs)
    refuses the whole file with an InterchangeError naming the record; this KB is then unchanged.
    What passes is held within the bounds this KB's own updates keep (`_within_bounds`)."""
    name = label or (str(source) if not isinstance(source, Tables) else "<tables>")
    other_tables = source if isinstance(source, Tables) else load_kb_file(Path(source))
    incoming = _checked(other_tables, name, rule)
    report = TransferReport(source=name, format="kb-mcp")
    with store.transaction() as tx:
        _merge_into(tx, incoming, rule, report)
    return report


class _Incoming(NamedTuple):
    """The records of another KB file, each checked against its model."""

    states: list[State]
    optimizations: list[Optimization]
    scores: list[Score]  # held within bounds
    transitions: list[Transition]
    outcomes: list[Outcome]
    lessons: list[Lesson]
    candidates: list[CandidateRecord]


_MODELS: dict[str, type[BaseModel]] = {
    "states": State, "optimizations": Optimization, "transitions": Transition, "outcomes": Outcome,
    "lessons": Lesson, "candidates": CandidateRecord,
}


def _refused(source: str, what: str, why: str) -> InterchangeError:
    return InterchangeError(
        f"{source}: {what}: {why}. Nothing was merged; this KB is unchanged. The file is damaged or was "
        "not written by kb-mcp: ask its owner for a fresh `kb-mcp kb export`, or leave it out"
    )


def _why(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False)
        said = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']} (got {e.get('input')!r:.40})"
                         for e in errors[:3])
        return said + (f"; and {len(errors) - 3} more" if len(errors) > 3 else "")
    return f"malformed ({exc})"


def _nonfinite(value: Any, where: str = "") -> str | None:
    """The path of the first NaN or infinite number in a JSON value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "value"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _nonfinite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _checked(tables: Tables, source: str, rule: ScoreRule) -> _Incoming:
    """Every record of `tables` validated (scores also held within bounds); raises InterchangeError
    naming the first record that is not what its model says."""
    records: dict[str, list[Any]] = {}
    for table, model in _MODELS.items():
        records[table] = []
        for key, doc in tables.records[table].items():
            what = f"{table[:-1]} {key!r}"
            bad = _nonfinite(doc)
            if bad is not None:
                raise _refused(source, what, f"{bad} is not a finite number")
            try:
                records[table].append(model.model_validate(doc))
            except (ValidationError, TypeError, ValueError) as exc:
                raise _refused(source, what, _why(exc)) from exc
    scores = []
    for (state_id, arch, track), doc in tables.scores.items():
        for opt in sorted(doc["priors"].keys() | doc["stats"].keys()):
            try:
                score = decode_score(state_id, arch, opt, doc, validate=True)
            except (ValidationError, TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
                what = f"score of state {state_id!r}, optimization {opt!r}, arch {arch!r}, track {track!r}"
                raise _refused(source, what, _why(exc)) from exc
            if score is not None:
                scores.append(_within_bounds(score, rule))
    return _Incoming(records["states"], records["optimizations"], scores, records["transitions"],
                     records["outcomes"], records["lessons"], records["candidates"])


def _clamp(x: float, bounds: tuple[float, float]) -> float:
    return min(max(x, bounds[0]), bounds[1])


def bounded_speedup(speedup: float) -> float:
    """`speedup` within SPEEDUP_RANGE: what any prior or mean from another file may claim."""
    return _clamp(speedup, SPEEDUP_RANGE)


def _within_bounds(score: Score, rule: ScoreRule) -> Score:
    """A score from another file as this KB's own updates could have left it: each client's mean
    within SPEEDUP_RANGE (and its spread within what values in that range can have), the weights
    capped per client and in total by the numeric rule, its change-detection run dropped, and its
    prior within SPEEDUP_RANGE and MAX_PRIOR_WEIGHT, as an imported reference prior is."""
    spread = (_LOG_RANGE[1] - _LOG_RANGE[0]) ** 2 / 4.0  # the most m2 / weight of values in the range
    clients = {name: [w, _clamp(mean, _LOG_RANGE), min(m2, w * spread)] for name, (w, mean, m2) in
               ((n, (float(v[0]), float(v[1]), float(v[2]))) for n, v in score.clients.items())}
    if not score.clients and score.weight > 0:  # no clients named: one unnamed client holds it all
        clients[""] = [score.weight, _clamp(score.mean_log_speedup, _LOG_RANGE),
                       min(score.m2_log_speedup, score.weight * spread)]
    claimed = score.model_copy(update={"clients": clients})
    bounded = rule.merge_scores(rule.empty_like(claimed), claimed)
    return bounded.model_copy(update={
        "prior_mean_log_speedup": _clamp(score.prior_mean_log_speedup, _LOG_RANGE),
        "prior_weight": min(score.prior_weight, MAX_PRIOR_WEIGHT),
    })


def _left_out(tx: Transaction, theirs: list[Outcome], mine_outcomes: set[str]) -> list[Outcome]:
    """The other file's outcomes (not held here) of a candidate whose credit another outcome holds
    (`kb.view.credit_holders`): here, or earlier in that file. One candidate's measurement moves scores once."""
    first = credit_holders(theirs)
    found = []
    for o in theirs:
        if o.id in mine_outcomes:
            continue  # shared history: counted once already
        holder = tx.credited_outcome(o.candidate_id) or first[o.candidate_id]
        if holder.id != o.id:
            found.append(o)
    return found


def _merge_into(tx: Transaction, other: _Incoming, rule: ScoreRule, report: TransferReport) -> None:
    mine_outcomes = tx.outcome_ids()
    shared = [o for o in other.outcomes if o.id in mine_outcomes]
    report.outcomes_shared = len(shared)
    left_out = _left_out(tx, other.outcomes, mine_outcomes)
    report.outcomes_left_out = len(left_out)
    skipped = {o.id for o in left_out}
    theirs = [o for o in other.outcomes if o.id not in skipped]

    for state in other.states:
        if tx.get_state(state.id) is None:
            tx.put_state(state)
            report.states_added += 1
    for opt in other.optimizations:
        if tx.get_optimization(opt.id) is None:
            tx.put_optimization(opt)
            report.optimizations_added += 1

    # what the shared outcomes contributed to each score, so it is not pooled twice, and what the outcomes
    # left out did, so a candidate credited elsewhere does not credit this score too
    counted_by_pair: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for o in shared + left_out:
        if rule.counts_toward_score(o.verdict) and not o.flagged:
            counted_by_pair[(o.state_id, o.optimization_id)].append(o)

    for theirs_score in other.scores:
        state_id, arch, track = theirs_score.state_id, theirs_score.arch, theirs_score.track
        part = rule.empty_like(theirs_score)
        for o in counted_by_pair.get((state_id, theirs_score.optimization_id), []):
            if (arch == ALL_ARCH or o.arch == arch) and o.track == track:
                part = rule.apply_outcome(part, o.verdict, o.speedup, o.created_at, client=o.agent)
        mine = tx.get_score(state_id, theirs_score.optimization_id, arch, track)
        extra = rule.subtract_scores(theirs_score, part)
        if mine is None:  # nothing shared can be in it, but outcomes left out can
            tx.put_score(extra if part.attempts else theirs_score)
            report.scores_added += 1
            continue
        if extra.attempts == 0 and extra.samples == 0:
            continue  # nothing they measured that we lack
        tx.put_score(rule.merge_scores(mine, extra))
        report.scores_pooled += 1

    shared_moves: dict[tuple[str, str, str], int] = defaultdict(int)
    for o in shared:
        if o.next_state_id and o.verdict.is_valid and not o.flagged:
            shared_moves[(o.state_id, o.optimization_id, o.next_state_id)] += 1
    # A move is counted once per valid outcome that made it (`record_outcome`), so a file may claim no more
    # moves than its own outcomes show: a count beyond them is held to them, not believed.
    their_moves: dict[tuple[str, str, str], int] = defaultdict(int)
    for o in theirs:
        if o.next_state_id and o.verdict.is_valid:
            their_moves[(o.state_id, o.optimization_id, o.next_state_id)] += 1
    for tr in other.transitions:
        move = (tr.state_id, tr.optimization_id, tr.next_state_id)
        extra_count = min(tr.count, their_moves.get(move, 0)) - shared_moves.get(move, 0)
        if extra_count > 0:
            tx.bump_transition(tr.state_id, tr.optimization_id, tr.next_state_id, extra_count)
            report.transitions_added += extra_count

    for o in theirs:
        if o.id not in mine_outcomes:
            tx.put_outcome(o)
            report.outcomes_added += 1
    for lesson in other.lessons:
        if lesson.outcome_id not in skipped and tx.get_lesson(lesson.id) is None:
            tx.put_lesson(lesson)
            report.lessons_added += 1
    for rec in other.candidates:
        if tx.get_verdict(rec.key) is None:  # shown here, never measured from: not this server's own verdict
            tx.put_candidate(rec if rec.imported_from else rec.model_copy(update={"imported_from": report.source}))
            report.candidates_added += 1
