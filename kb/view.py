"""Typed reads over one version of the KB tables, and the typed writes of a transaction.

`KBView` is what `KBStore.read()` yields; `Transaction` (what `KBStore.transaction()` yields) is a
view that can also write. Writes become ops (see `kb.tables`): applied to the tables at once, so
reads inside the transaction see them, and written to disk when the transaction commits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from kb_mcp.kb import ids
from kb_mcp.kb.models import (
    ALL_ARCH,
    CALIBRATION_FIELDS,
    DEFAULT_TRACK,
    MAX_COUNT,
    SCHEMA_VERSION,
    CandidateRecord,
    KBStats,
    Lesson,
    Optimization,
    Outcome,
    Score,
    ScoreStats,
    State,
    Track,
    Transition,
    stored_instant,
    utcnow,
)
from kb_mcp.kb.ops import FP32, DropRecord, KBOp, PutMeta, PutRecord, from_wire
from kb_mcp.kb.tables import Tables, decode_score, score_op, sole_verifier

TRACK_ALARMS = "track_alarms"
"""Meta field: per "track/arch family", the level of its change detector (files without it: all 0)."""
CANDIDATES_REMOVED = "candidates_removed"
"""Meta field: per client, how many of its candidates' verdicts left the KB under its bound (files without it: 0)."""


def credit_holders(outcomes: Iterable[Outcome]) -> dict[str, Outcome]:
    """For each candidate, the outcome that holds its credit: the first recorded for it (the oldest;
    of two recorded at once, the one stored first).

    One candidate's measurement moves the KB's scores once: the outcome holding its credit is the
    only one of it whose speedup credits a score, bumps a transition, keeps a lesson or vouches for
    an agent-made optimization. `record_outcome` refuses to record the candidate for another
    (state, optimization), and a merge leaves out another file's outcomes of a candidate whose credit
    another outcome holds (and takes them out of that file's scores), so one fast kernel cannot lift
    every optimization it is recorded against.
    """
    found: dict[str, Outcome] = {}
    for outcome in sorted(outcomes, key=lambda o: o.created_at):  # stable: ties keep their stored order
        found.setdefault(outcome.candidate_id, outcome)
    return found


class KBView:
    """Read access to the KB, returning the models of `kb.models`."""

    def __init__(self, tables: Tables) -> None:
        self._t = tables

    # ---- meta ---------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        """Layout version stored in the file."""
        return int(self._t.meta.get("schema_version", SCHEMA_VERSION))

    @property
    def meta(self) -> dict[str, Any]:
        """The file's meta record (format, schema version, applied journal sequence, kb id)."""
        return dict(self._t.meta)

    def track_alarm(self, track: Track, family: str) -> float:
        """Level of the change detector of one track and arch family (`policy.update.track_alarm_after`),
        kept in the meta record's TRACK_ALARMS field; 0 in files that never stored one."""
        alarms = self._t.meta.get(TRACK_ALARMS) or {}
        return float(alarms.get(f"{Track(track).value}/{family}", 0.0))

    # ---- states -------------------------------------------------------------------------------

    def get_state(self, state_id: str) -> State | None:
        """The state with this id, or None."""
        doc = self._t.records["states"].get(state_id)
        return State.model_validate(doc) if doc is not None else None

    def list_states(self) -> list[State]:
        """Every state, in insertion order (seed states first)."""
        return [State.model_validate(d) for d in self._t.records["states"].values()]

    def state_ids(self) -> list[str]:
        """Every state id (cheaper than list_states)."""
        return list(self._t.records["states"])

    def states_with_key(self, key: str) -> list[State]:
        """States whose signature has this exact 'primary/secondary' key."""
        return [State.model_validate(self._t.records["states"][i]) for i in self._t.states_by_key.get(key, [])]

    # ---- optimizations ------------------------------------------------------------------------

    def get_optimization(self, optimization_id: str) -> Optimization | None:
        """The optimization with this id, or None."""
        doc = self._t.records["optimizations"].get(optimization_id)
        return Optimization.model_validate(doc) if doc is not None else None

    def agent_written_optimization_ids(self) -> set[str]:
        """Ids of optimizations whose text an agent wrote (origin agent or campaign, or revised by one):
        the only ones `kb.provenance` has to check before their text is shown."""
        return {
            oid for oid, d in self._t.records["optimizations"].items()
            if d.get("origin") in ("agent", "campaign") or d.get("author")
        }

    def list_optimizations(self) -> list[Optimization]:
        """Every optimization."""
        return [Optimization.model_validate(d) for d in self._t.records["optimizations"].values()]

    # ---- scores -------------------------------------------------------------------------------

    def get_score(
        self, state_id: str, optimization_id: str, arch: str = ALL_ARCH, track: Track = DEFAULT_TRACK
    ) -> Score | None:
        """The score of an optimization in a state for one arch family (ALL_ARCH: pooled) and track."""
        doc = self._t.score_doc(state_id, arch, Track(track).value)
        return decode_score(state_id, arch, optimization_id, doc) if doc is not None else None

    def scores(self, state_id: str, arch: str = ALL_ARCH, track: Track = DEFAULT_TRACK) -> list[Score]:
        """Every score of a state stored under exactly `arch` and `track`."""
        doc = self._t.score_doc(state_id, arch, Track(track).value)
        if doc is None:
            return []
        out = []
        for opt in doc["priors"].keys() | doc["stats"].keys():
            s = decode_score(state_id, arch, opt, doc)
            if s is not None:
                out.append(s)
        out.sort(key=lambda s: s.optimization_id)
        return out

    def calibration_sums(self, track: Track = DEFAULT_TRACK) -> tuple[float, ...]:
        """The track's sums of measured means against prior means over its pooled scores
        (`kb.tables.CALIBRATION_FIELDS`), kept up to date with every change."""
        sums = self._t.calibration.get(Track(track).value)
        return tuple(sums) if sums is not None else (0.0,) * len(CALIBRATION_FIELDS)

    def score_keys(self, state_id: str) -> list[tuple[str, Track]]:
        """(arch family or ALL_ARCH, track) pairs that hold scores for a state."""
        return [(arch, Track(track)) for arch, track in sorted(self._t.score_keys.get(state_id, ()))]

    def candidates(self, state_id: str, arch: str = ALL_ARCH, track: Track = DEFAULT_TRACK) -> list[Score]:
        """The optimizations applicable in a state, each with the score to judge it by on `arch` and `track`.

        `arch` is a family (see `kb.arch.arch_family`). The per-arch score is used where it holds
        measurements; otherwise the pooled ALL_ARCH score stands in (its `arch` field says which).
        Only `track`'s measurements count: an optimization with none on another track than fp32
        stands there on its fp32 prior alone (a prior is a belief about the optimization, the same
        on every track; a speedup measured on one track says nothing certain about another).
        Deprecated optimizations are left out.
        """
        out: list[Score] = []
        for opt, doc, doc_arch, prior_only in self._sources(state_id, arch, Track(track).value):
            chosen = decode_score(state_id, doc_arch, opt, doc)
            if chosen is not None and prior_only:  # another track's prior, none of its measurements
                chosen = Score(
                    state_id=state_id, optimization_id=opt, arch=ALL_ARCH, track=Track(track),
                    prior_mean_log_speedup=chosen.prior_mean_log_speedup, prior_weight=chosen.prior_weight,
                    updated_at=chosen.updated_at,
                )
            if chosen is not None:
                out.append(chosen)
        return out

    def candidate_stats(self, state_id: str, arch: str = ALL_ARCH, track: Track = DEFAULT_TRACK) -> list[ScoreStats]:
        """The numbers of `candidates(...)` that calibrating a state's priors needs, read without
        building Score records (`record_outcome` needs them for every outcome)."""
        out = []
        for opt, doc, _, prior_only in self._sources(state_id, arch, Track(track).value):
            prior = doc["priors"].get(opt)
            row = None if prior_only else doc["stats"].get(opt)
            pm, pw = prior if prior is not None else (0.0, 1.0)
            if row is None:
                out.append(ScoreStats(pm, 0.0, 0.0, 0.0, pw))
            else:
                out.append(ScoreStats(pm, row[0], row[1], float(row[8] if len(row) >= 12 else row[2]), pw))
        return out

    def _sources(self, state_id: str, arch: str, track: str) -> list[tuple[str, dict[str, Any], str, bool]]:
        """(optimization, score document, its arch, prior only) for each candidate (see `candidates`)."""
        pooled = self._t.score_doc(state_id, ALL_ARCH, track)
        per_arch = self._t.score_doc(state_id, arch, track) if arch != ALL_ARCH else None
        strict = self._t.score_doc(state_id, ALL_ARCH, FP32) if track != FP32 else None
        opts: set[str] = set()
        for doc in (pooled, per_arch, strict):
            if doc is not None:
                opts |= doc["priors"].keys() | doc["stats"].keys()
        records = self._t.records["optimizations"]
        out = []
        for opt in sorted(opts):
            rec = records.get(opt)
            if rec is None or rec.get("deprecated"):
                continue
            if per_arch is not None and opt in per_arch["stats"]:
                out.append((opt, per_arch, arch, False))
            elif pooled is not None and (opt in pooled["priors"] or opt in pooled["stats"]):
                out.append((opt, pooled, ALL_ARCH, False))
            elif per_arch is not None and (opt in per_arch["priors"] or opt in per_arch["stats"]):
                out.append((opt, per_arch, arch, False))
            elif strict is not None:
                out.append((opt, strict, ALL_ARCH, True))
        return out

    # ---- lessons, transitions, outcomes, candidates ---------------------------------------------

    def lessons(self, state_id: str, optimization_id: str, limit: int | None = None) -> list[Lesson]:
        """Lessons about an optimization in a state, newest first."""
        keys = self._t.lessons_by_pair.get((state_id, optimization_id), [])
        docs = [self._t.records["lessons"][k] for k in keys]
        docs.sort(key=lambda d: d.get("created_at", ""), reverse=True)
        return [Lesson.model_validate(d) for d in docs[:limit]]

    def get_lesson(self, lesson_id: str) -> Lesson | None:
        """The lesson with this id, or None."""
        doc = self._t.records["lessons"].get(lesson_id)
        return Lesson.model_validate(doc) if doc is not None else None

    def list_lessons(self) -> list[Lesson]:
        """Every lesson."""
        return [Lesson.model_validate(d) for d in self._t.records["lessons"].values()]

    def transitions(self, state_id: str, optimization_id: str | None = None) -> list[Transition]:
        """Where applying optimizations in `state_id` led, most frequent first."""
        recs = self._t.records["transitions"]
        rows = [Transition.model_validate(recs[k]) for k in self._t.transitions_by_state.get(state_id, [])]
        if optimization_id is not None:
            rows = [r for r in rows if r.optimization_id == optimization_id]
        rows.sort(key=lambda r: (-r.count, r.optimization_id, r.next_state_id))
        return rows

    def get_outcome(self, outcome_id: str) -> Outcome | None:
        """The replay-buffer entry with this id, or None."""
        doc = self._t.records["outcomes"].get(outcome_id)
        return Outcome.model_validate(doc) if doc is not None else None

    def outcomes(self) -> list[Outcome]:
        """The whole replay buffer, oldest first."""
        docs = sorted(self._t.records["outcomes"].values(), key=lambda d: d.get("created_at", ""))
        return [Outcome.model_validate(d) for d in docs]

    def outcome_ids(self) -> set[str]:
        """Ids of every outcome in the replay buffer."""
        return set(self._t.records["outcomes"])

    def outcomes_for_candidate(self, candidate_id: str) -> list[Outcome]:
        """Outcomes recorded for one candidate: one (`credited_outcome`), except in files written before
        a candidate's credit was held by one outcome."""
        recs = self._t.records["outcomes"]
        return [Outcome.model_validate(recs[k]) for k in self._t.outcomes_by_candidate.get(candidate_id, [])]

    def credited_outcome(self, candidate_id: str) -> Outcome | None:
        """The outcome that holds the candidate's credit (`credit_holders`), or None: none recorded yet."""
        return credit_holders(self.outcomes_for_candidate(candidate_id)).get(candidate_id)

    def list_candidates(self) -> list[CandidateRecord]:
        """Every stored candidate verdict (one per candidate and options digest)."""
        return [CandidateRecord.model_validate(d) for d in self._t.records["candidates"].values()]

    def candidate_verdicts(self, candidate_id: str) -> list[CandidateRecord]:
        """Every stored verdict on a candidate, strongest first (see `CandidateRecord.order`)."""
        recs = self._t.records["candidates"]
        found = [CandidateRecord.model_validate(recs[k]) for k in self._t.verdicts_by_candidate.get(candidate_id, [])]
        return sorted(found, key=lambda r: r.order, reverse=True)

    def problem_verdicts(self, problem_hash: str) -> list[CandidateRecord]:
        """Every stored verdict on a candidate of one problem (by its content hash), oldest first."""
        recs = self._t.records["candidates"]
        found = [CandidateRecord.model_validate(recs[k]) for k in self._t.verdicts_by_problem.get(problem_hash, [])]
        return sorted(found, key=lambda r: r.created_at)

    def composed_verdict(self, problem_hash: str) -> CandidateRecord | None:
        """The verdict a composition takes for the problem (`kb.composition.best_verdict` of its verdicts), or
        None. Read through an index, so it does not validate every verdict of the problem."""
        return self._t.picks.pick(problem_hash)

    def composition_takes(self, candidate_id: str) -> bool:
        """Whether a composition takes the candidate for a problem it has a verdict of (`composed_verdict`)."""
        return self._t.picks.takes_candidate(candidate_id)

    def get_candidate(self, candidate_id: str) -> CandidateRecord | None:
        """The server's strongest stored verdict on a candidate, or None (weaker ones never shadow it)."""
        found = self.candidate_verdicts(candidate_id)
        return found[0] if found else None

    def sole_candidates(self, client: str) -> list[str]:
        """The candidates `client` alone verified (every verdict of this KB's own on them names it as its
        one verifier, `CandidateRecord.verified_by`), oldest first by their newest verdict: whose kept
        sources and verdicts are that client's alone to lose (`tools.candidate_store.trim`). A candidate
        another client verified too, or one a verdict names nobody for (written before verifiers were
        kept), is nobody's alone; verdicts merged in from another KB file are not this KB's clients' and
        are left out. Read through an index by verifier, so its cost follows the client's own verdicts."""
        recs = self._t.records["candidates"]
        newest: dict[str, datetime] = {}
        for cid in set(self._t.verdicts_by_sole_verifier.get(client, {}).values()):
            own = [recs[k] for k in self._t.verdicts_by_candidate.get(cid, []) if not recs[k].get("imported_from")]
            if all(sole_verifier(doc) == client for doc in own):
                newest[cid] = max(stored_instant(doc.get("created_at")) for doc in own)
        return sorted(newest, key=lambda c: (newest[c], c))

    def own_verdict_keys(self, candidate_id: str) -> list[str]:
        """The keys of this KB's own verdicts on a candidate (those merged in from another file left out)."""
        recs = self._t.records["candidates"]
        return [k for k in self._t.verdicts_by_candidate.get(candidate_id, []) if not recs[k].get("imported_from")]

    def candidates_removed(self, client: str | None = None) -> int:
        """How many candidates' verdicts left the KB under their client's bound (`tools.candidate_store.trim`):
        `client`'s, or every client's when None. Kept in the meta record's CANDIDATES_REMOVED field."""
        removed = self._t.meta.get(CANDIDATES_REMOVED) or {}
        if client is not None:
            return int(removed.get(client, 0))
        return sum(int(n) for n in removed.values())

    def is_named(self, candidate_id: str) -> bool:
        """Whether an outcome (as its candidate or its parent) or a lesson names the candidate
        (`kb.tables.names_of`). Read through an index, so its cost does not follow the KB's size."""
        return candidate_id in self._t.names_by_candidate

    def candidate_verifiers(self, candidate_id: str) -> set[str] | None:
        """The clients whose compile_and_verify produced one of the candidate's strongest verdicts (this
        server's own, where it has any): those of the strength its outcomes are measured from. A weaker
        check (compile-only, loosened) of a source another client timed on a GPU does not make its
        client one, since an outcome it recorded would claim that other client's measurement. None when
        none of those verdicts names them (written before they were kept: who verified it is unknown)."""
        found = self.candidate_verdicts(candidate_id)
        found = [rec for rec in found if rec.imported_from is None] or found
        top = found[0].strength.rank if found else 0  # strongest first
        named = [rec.verified_by for rec in found if rec.strength.rank == top and rec.verified_by]
        return {client for clients in named for client in clients} if named else None

    def own_candidate(self, candidate_id: str) -> CandidateRecord | None:
        """This server's strongest verdict on a candidate, or None: verdicts merged in from another KB
        file (`CandidateRecord.imported_from`) are left out, since outcomes are measured only from its own."""
        return next((rec for rec in self.candidate_verdicts(candidate_id) if rec.imported_from is None), None)

    def speaks_for(self, candidate_id: str, client: str) -> bool:
        """Whether `client` may record outcomes of the candidate, and so say what it was made from: only a
        client whose compile_and_verify on this KB produced one of its strongest verdicts may
        (`candidate_verifiers`), or anyone where who verified it is unknown (older KB files); nobody where
        all its verdicts were merged in from another file."""
        if self.own_candidate(candidate_id) is None:
            return False
        verifiers = self.candidate_verifiers(candidate_id)
        return verifiers is None or client in verifiers

    def made_outcomes(self, candidate_id: str) -> list[Outcome]:
        """The outcomes that say how the candidate was made (lineage, credit): those recorded by a client
        that may speak for it (`speaks_for`), oldest first. Others' records of it say nothing of it."""
        verifiers = self.candidate_verifiers(candidate_id)
        found = [o for o in self.outcomes_for_candidate(candidate_id) if verifiers is None or o.agent in verifiers]
        return sorted(found, key=lambda o: o.created_at)

    def get_verdict(self, key: str) -> CandidateRecord | None:
        """The verdict stored under one verdict key (`CandidateRecord.key`), or None."""
        doc = self._t.records["candidates"].get(key)
        return CandidateRecord.model_validate(doc) if doc is not None else None

    # ---- summary ----------------------------------------------------------------------------------

    def stats(self) -> KBStats:
        """Counts of everything in the KB."""
        recs = self._t.records
        n_scores = measured = 0
        arches: set[str] = set()
        tracks: set[str] = set()
        for (_, arch, track), doc in self._t.scores.items():
            n_scores += len(doc["priors"].keys() | doc["stats"].keys())
            measured += len(doc["stats"])
            arches.add(arch)
            tracks.add(track)
        verdicts = Counter(d["verdict"] for d in recs["outcomes"].values())
        return KBStats(
            schema_version=self.schema_version,
            states=dict(Counter(d.get("origin", "seed") for d in recs["states"].values())),
            optimizations=dict(Counter(d.get("origin", "seed") for d in recs["optimizations"].values())),
            scores=n_scores,
            measured_scores=measured,
            arch_families=sorted(arches),
            tracks=sorted(tracks),
            outcomes=dict(verdicts),
            flagged_outcomes=sum(1 for d in recs["outcomes"].values() if d.get("flagged")),
            lessons=len(recs["lessons"]),
            transitions=sum(int(d.get("count", 0)) for d in recs["transitions"].values()),
            candidates=len(self._t.verdicts_by_candidate),
            candidates_removed=self.candidates_removed(),
        )


class Transaction(KBView):
    """A view that writes. Obtain it from `KBStore.transaction()`; it commits when the block exits.

    Every write is whole-record (put by natural key): read the record, build the new model,
    put it. The store holds the cross-process lock for the whole block, so nothing changes between
    the read and the write.
    """

    def __init__(self, tables: Tables) -> None:
        super().__init__(tables)
        self.ops: list[KBOp] = []
        self._now = utcnow().isoformat()

    def _do(self, op: KBOp) -> None:
        self._t.apply(op)
        self.ops.append(op)

    def replay(self, wire_ops: list[list[Any]]) -> None:
        """Applies ops made elsewhere (records persisted while waiting for the lock, in their wire
        form) as part of this one."""
        for wire in wire_ops:
            self._do(from_wire(wire))

    def put_state(self, state: State) -> None:
        """Adds or replaces a state."""
        self._do(PutRecord("states", state.id, state.model_dump(mode="json")))

    def put_optimization(self, optimization: Optimization) -> None:
        """Adds or replaces an optimization."""
        self._do(PutRecord("optimizations", optimization.id, optimization.model_dump(mode="json")))

    def put_score(self, score: Score) -> None:
        """Adds or replaces the score of (state, optimization, arch, track)."""
        self._do(score_op(score, self._now))

    def put_lesson(self, lesson: Lesson) -> None:
        """Adds or replaces a lesson."""
        self._do(PutRecord("lessons", lesson.id, lesson.model_dump(mode="json")))

    def put_outcome(self, outcome: Outcome) -> None:
        """Adds or replaces a replay-buffer entry."""
        self._do(PutRecord("outcomes", outcome.id, outcome.model_dump(mode="json")))

    def put_transition(self, transition: Transition) -> None:
        """Adds or replaces a transition count."""
        key = ids.transition_key(transition.state_id, transition.optimization_id, transition.next_state_id)
        self._do(PutRecord("transitions", key, transition.model_dump(mode="json")))

    def bump_transition(self, state_id: str, optimization_id: str, next_state_id: str, n: int = 1) -> Transition:
        """Counts `n` more moves from `state_id` to `next_state_id` by `optimization_id`."""
        key = ids.transition_key(state_id, optimization_id, next_state_id)
        doc = self._t.records["transitions"].get(key)
        count = min(MAX_COUNT, (int(doc["count"]) if doc else 0) + n)  # saturates: no count is that large
        tr = Transition(state_id=state_id, optimization_id=optimization_id, next_state_id=next_state_id, count=count)
        self.put_transition(tr)
        return tr

    def put_candidate(self, record: CandidateRecord) -> None:
        """Stores the server's verdict on a candidate under its verdict key (compile_and_verify does
        this): it replaces only a verdict checked with the same options on the same device."""
        self._do(PutRecord("candidates", record.key, record.model_dump(mode="json")))

    def drop_verdicts(self, candidate_ids: list[str], client: str) -> int:
        """Removes this KB's own verdicts on the candidates (every options digest; those merged in from
        another file stay) and counts each candidate that had one as one of `client`'s removed under its
        bound (`candidates_removed`); returns how many verdicts went. `tools.candidate_store.trim` decides which."""
        dropped = gone = 0
        for cid in candidate_ids:
            keys = self.own_verdict_keys(cid)
            for key in keys:
                self._do(DropRecord("candidates", key))
            dropped, gone = dropped + len(keys), gone + bool(keys)
        if gone:
            removed = dict(self._t.meta.get(CANDIDATES_REMOVED) or {})
            removed[client] = int(removed.get(client, 0)) + gone
            self.set_meta(**{CANDIDATES_REMOVED: removed})
        return dropped

    def set_track_alarm(self, track: Track, family: str, level: float) -> None:
        """Stores the level of one track's and arch family's change detector (`track_alarm`)."""
        alarms = dict(self._t.meta.get(TRACK_ALARMS) or {})
        alarms[f"{Track(track).value}/{family}"] = level
        self.set_meta(**{TRACK_ALARMS: alarms})

    def set_meta(self, **values: Any) -> None:
        """Updates fields of the meta record (format and sequence fields are the store's own)."""
        reserved = {"format", "schema_version", "applied_seq"} & values.keys()
        if reserved:
            raise ValueError(f"meta fields {sorted(reserved)} are managed by the store")
        meta = {**self._t.meta, **values}
        self._do(PutMeta(meta))

