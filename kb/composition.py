"""The verdict a composition takes for a problem (a part of a decomposed model): one rule, read by
`decomposition.assemble` (what the composed candidate runs for the part) and by
`tools.candidate_store.Needs` (whose source the KB keeps for it), and the index that keeps each
problem's pick (`Picks`, kept by `kb.tables.Tables` and read through `KBView.composed_verdict`).

The rule (`best_verdict`): of the problem's verdicts that are standard (checked on a GPU with the
default options), not flagged and `faster`, the largest speedup over the better baseline (one that is
no number counts as none), then the newest, then the greatest verdict key (so equal ones give the same
pick whatever order they are read in). Only a stored record that validates as a `CandidateRecord` can
be taken: a KB file is untrusted.

Why an index: `trim` asks, under the KB lock and on every verification, whether a composition takes
each of a client's candidates. Validating every verdict of the problem for that cost some 165 ms at
10,000 verdicts of one problem. `Picks` ranks each stored verdict once, from its raw fields
(`raw_rank`), and validates only the verdicts that rank first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

from kb_mcp.kb.models import CandidateRecord, Strength, Verdict, legacy_strength, stored_instant

__all__ = ["Picks", "Rank", "best_verdict", "rank", "raw_rank", "takes"]

Rank = tuple[float, datetime]
"""How a verdict a composition would take ranks: (speedup, when it was made); ties go by verdict key."""

# The times the KB writes (pydantic's JSON form of an aware datetime): read by `datetime.fromisoformat`
# exactly as pydantic reads them; any other text is read by validating the record.
_CANONICAL_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})")


def takes(record: CandidateRecord) -> bool:
    """Whether a composition may take this verdict for its part: standard, not flagged, faster."""
    return record.strength == Strength.standard and not record.flagged and record.verdict == Verdict.faster


def _speedup(value: float | None) -> float:
    return 0.0 if value is None or math.isnan(value) else value  # NaN would make the order depend on reading order


def rank(record: CandidateRecord) -> Rank:
    """Where a verdict a composition may take ranks among its problem's (`takes`): largest speedup, then newest."""
    return (_speedup(record.speedup_vs_baseline), stored_instant(record.created_at))


def best_verdict(records: Iterable[CandidateRecord]) -> CandidateRecord | None:
    """The verdict a composition takes among `records` (validated verdicts of one problem), or None."""
    return max((r for r in records if takes(r)), key=lambda r: (*rank(r), r.key), default=None)


def raw_rank(doc: Any) -> Rank | None:
    """`rank` of a stored verdict record, None when a composition would not take it (`takes`). Read from
    the raw fields where they are in the form the KB writes (no validation, which costs some 10 us a
    record); any other form is validated, and a record that does not validate is None. For a record
    that validates it is what `rank` gives; one damaged in a field the rule does not read may still
    rank, which is why `Picks` validates what it picks."""
    if not isinstance(doc, dict):
        return None
    fast = _raw_fields(doc)
    if fast is not False:
        return fast
    try:
        record = CandidateRecord.model_validate(doc)
    except ValueError:  # pydantic's ValidationError: a damaged record is never taken
        return None
    return rank(record) if takes(record) else None


def _raw_fields(doc: dict[str, Any]) -> Rank | Literal[False] | None:
    """The raw reading of `raw_rank`; False where a field is not in the KB's own form."""
    verdict, flagged = doc.get("verdict"), doc.get("flagged", False)
    # without a strength, CandidateRecord's legacy rule, as validation applies it before any field is read
    strength = doc["strength"] if "strength" in doc else legacy_strength(doc).value
    if type(verdict) is not str or type(strength) is not str or type(flagged) is not bool:
        return False
    if verdict != Verdict.faster.value or strength != Strength.standard.value or flagged:
        return None  # whatever the record validates to, a composition does not take it
    speedup, created = doc.get("speedup_vs_baseline"), doc.get("created_at")
    if (speedup is not None and type(speedup) is not float) or type(created) is not str:
        return False
    if not _CANONICAL_TIME.fullmatch(created):
        return False
    try:
        when = datetime.fromisoformat(created)
    except ValueError:  # 2026-02-30 and the like: validation says what it is
        return False
    return (_speedup(speedup), when)


class Picks:
    """Each problem's pick (`best_verdict` of its validated verdicts), kept for the problems asked about.

    `Tables` tells it of every verdict put or dropped (`added`, `removed`), whether from a transaction,
    the journal, a merge or a file loaded, so the pick follows every change. A problem's verdicts are
    ranked when it is first asked about (`raw_rank`, a few microseconds each) and then one at a time
    as they change; a pick is validated before it is given, and one that does not validate is never
    picked again until it is replaced.
    """

    def __init__(self, docs: dict[str, dict[str, Any]], by_problem: dict[str, list[str]],
                 by_candidate: dict[str, list[str]]) -> None:
        self._docs, self._by_problem, self._by_candidate = docs, by_problem, by_candidate
        self._ranks: dict[str, dict[str, Rank | None]] = {}  # problem -> verdict key -> raw_rank
        self._picked: dict[str, CandidateRecord | None] = {}  # problem -> its pick, until it changes

    def added(self, key: str, doc: dict[str, Any]) -> None:
        """A verdict was stored under `key` (its index entries already made)."""
        problem = doc.get("problem_hash", "")
        if problem in self._ranks:
            self._ranks[problem][key] = raw_rank(doc)
        self._picked.pop(problem, None)

    def removed(self, key: str, doc: dict[str, Any]) -> None:
        """The verdict stored under `key` went (dropped, or about to be replaced)."""
        problem = doc.get("problem_hash", "")
        if problem in self._ranks:
            self._ranks[problem].pop(key, None)
        self._picked.pop(problem, None)

    def pick(self, problem_hash: str) -> CandidateRecord | None:
        """The verdict a composition takes for the problem, or None."""
        if problem_hash not in self._picked:
            self._picked[problem_hash] = self._choose(problem_hash)
        return self._picked[problem_hash]

    def takes_candidate(self, candidate_id: str) -> bool:
        """Whether a composition takes the candidate for one of the problems it has a verdict of. A
        problem whose verdicts of it no composition would take is never ranked (its verdicts unread)."""
        docs = [self._docs[k] for k in self._by_candidate.get(candidate_id, [])]
        problems = {d.get("problem_hash", "") for d in docs if raw_rank(d) is not None}
        return any((p := self.pick(h)) is not None and p.candidate_id == candidate_id for h in problems)

    def _choose(self, problem_hash: str) -> CandidateRecord | None:
        ranks = self._ranks.get(problem_hash)
        if ranks is None:
            ranks = self._ranks[problem_hash] = {k: raw_rank(self._docs[k]) for k in
                                                 self._by_problem.get(problem_hash, [])}
        while True:
            top = max((r for r in ranks.values() if r is not None), default=None)
            if top is None:
                return None
            tied = [k for k, r in ranks.items() if r == top]
            valid = []
            for key in tied:
                try:
                    valid.append(CandidateRecord.model_validate(self._docs[key]))
                except ValueError:  # damaged: never taken, until a record replaces it
                    ranks[key] = None
            best = best_verdict(valid)
            if best is not None:
                return best
            for key in tied:  # none of them validates to a verdict a composition takes: rank the rest
                ranks[key] = None
