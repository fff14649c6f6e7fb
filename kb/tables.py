"""The KB's tables in memory, how a change (`kb.ops`) edits them, and their TinyDB file layout.

One code path applies a change, whether it comes from a live transaction or from replaying the
journal, so a process that replays sees exactly what the writer saw. Indexes are kept up to date
by that same path, so lookups never scan a table.

File layout (a TinyDB JSON database: ``TinyDB(path).table("states").all()`` reads it)::

    {"meta":   {"1": {"format": "kb-mcp", "schema_version": 1, "applied_seq": N, ...}},
     "states": {"1": <State>, ...}, "optimizations": {...}, "lessons": {...},
     "outcomes": {...}, "transitions": {...}, "candidates": {...},
     "scores": {"1": {"state_id": S, "arch": A, "track": K, "updated_at": T,
                      "priors": {opt_id: [prior_mean_log_speedup, prior_weight]},
                      "stats":  {opt_id: [mean, m2, samples, attempts, successes,
                                          compile_failures, verify_failures, updated_at,
                                          weight, ok_weight, fail_weight,
                                          {client: [weight, mean, m2]},
                                          [run client, cusum, n, mean] or null,
                                          {client: [ok_weight, fail_weight]}]}}}}

Scores are stored one document per (state, arch, track) with a compact row per optimization. A
document without "track" is on the strict fp32 track (files written before tracks existed), and
fp32 documents are written without it. A stats row of the first eight fields only (written before
weights existed) counts every sample and failure once (`Score`'s weights from its counters); a row
without the rates per client (written before they were kept) holds its ok and fail weights as one
unnamed client's. A KB of
10,000 states x 100 optimizations holds a million scores, which as one JSON object each would be a
third of a gigabyte to parse; as rows it is ~25 MB. A Score whose optimization has no "stats" row
is still a pure prior (``Score.prior``). TinyDB doc ids are renumbered on every full write;
records are identified by their natural keys (ids), never by doc id.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from kb_mcp.kb import ids
from kb_mcp.kb.composition import Picks
from kb_mcp.kb.errors import KBFileError, KBNewerFormatError
from kb_mcp.kb.models import (
    ALL_ARCH,
    CALIBRATION_FIELDS,
    SCHEMA_VERSION,
    ChangeRun,
    Score,
    Track,
    calibration_terms,
    options_digest,
)
from kb_mcp.kb.ops import FP32, RECORD_TABLES, DropRecord, KBOp, PutMeta, PutRecord, PutScore, from_wire

FORMAT = "kb-mcp"
TABLES = ("meta", *RECORD_TABLES, "scores")



def check_schema(meta: dict[str, Any], where: str) -> None:
    """Refuses a KB file of another schema version: KBNewerFormatError for a higher one (a newer
    kb-mcp wrote it: upgrade, never repair), KBFileError otherwise."""
    version = meta.get("schema_version")
    if version == SCHEMA_VERSION:
        return
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise KBNewerFormatError(f"KB schema version {version} (this kb-mcp reads version {SCHEMA_VERSION})",
                                 where=where)
    raise KBFileError(f"{where}: KB schema version {version!r}, this kb-mcp reads version {SCHEMA_VERSION}",
                      where=where, action="open it with the kb-mcp version that wrote it and export it")


ScoreDoc = dict[str, Any]
ScoreKey = tuple[str, str, str]  # (state_id, arch, track)


def _row_terms(prior: list[float] | None, row: list[Any] | None) -> tuple[float, ...] | None:
    """The calibration terms of one stored (prior, stats row) pair, None when unmeasured."""
    if row is None:
        return None
    weight = float(row[8]) if len(row) >= 12 else float(row[2])
    if weight <= 0:
        return None
    pm, pw = prior if prior is not None else (0.0, 1.0)
    return calibration_terms(pm, row[0], row[1], weight, pw)


class LayoutError(ValueError):
    """The data is not a kb-mcp KB (wrong shape, missing keys); the message says where."""


def _record_key(table: str, doc: dict[str, Any]) -> str:
    if table == "candidates":  # one verdict per (candidate, options digest): docs/architecture.md
        digest = options_digest(doc.get("options") or {}, doc.get("device", ""), doc.get("arch", ""))
        return f"{doc['candidate_id']}/{digest}"
    if table == "transitions":
        return ids.transition_key(doc["state_id"], doc["optimization_id"], doc["next_state_id"])
    key: str = doc["id"]
    return key


def doc_track(doc: ScoreDoc) -> str:
    """The track of a score document (fp32 when it names none)."""
    track: str = doc.get("track", FP32)
    return track


def encode_score(score: Score) -> tuple[list[float], list[Any] | None]:
    """(prior pair, stats row or None): the compact form of a Score in its (state, arch, track) document."""
    prior = [score.prior_mean_log_speedup, score.prior_weight]
    measured = (
        score.samples or score.attempts or score.successes or score.compile_failures or score.verify_failures
        or score.mean_log_speedup or score.m2_log_speedup or score.weight or score.ok_weight or score.fail_weight
    )
    if score.prior and not measured:
        return prior, None
    row = [
        score.mean_log_speedup,
        score.m2_log_speedup,
        score.samples,
        score.attempts,
        score.successes,
        score.compile_failures,
        score.verify_failures,
        score.updated_at.isoformat(),
        score.weight,
        score.ok_weight,
        score.fail_weight,
        {name: list(stats) for name, stats in score.clients.items()},
        None if score.run is None else [score.run.client, score.run.cusum, score.run.n, score.run.mean],
        {name: list(rates) for name, rates in score.rates.items()},
    ]
    return prior, row


def decode_score(state_id: str, arch: str, opt_id: str, doc: ScoreDoc, *, validate: bool = False) -> Score | None:
    """The Score of `opt_id` in a (state, arch, track) document, or None when it has none.

    The KB's own rows are decoded with `model_construct`: they were validated when written, and
    decoding runs per suggestion over every optimization of a state, so validation would dominate
    the latency. A row from elsewhere (another KB file being merged) is untrusted: `validate=True`
    checks it against `Score`'s constraints, raising ValueError (pydantic's ValidationError) or
    TypeError for a row of the wrong shape.
    """
    track = Track(doc_track(doc))
    prior = doc["priors"].get(opt_id)
    row = doc["stats"].get(opt_id)
    if prior is None and row is None:
        return None
    pm, pw = prior if prior is not None else (0.0, 1.0)
    if row is None:
        if validate:
            return Score.model_validate(dict(state_id=state_id, optimization_id=opt_id, arch=arch, track=track,
                                             prior=True, prior_mean_log_speedup=pm, prior_weight=pw,
                                             updated_at=doc["updated_at"], weight=0.0))
        return Score.model_construct(
            state_id=state_id, optimization_id=opt_id, arch=arch, track=track, mean_log_speedup=0.0,
            m2_log_speedup=0.0, samples=0, attempts=0, successes=0, compile_failures=0, verify_failures=0,
            weight=0.0, ok_weight=0.0, fail_weight=0.0, clients={}, rates={}, run=None, prior=True,
            prior_mean_log_speedup=pm, prior_weight=pw, updated_at=datetime.fromisoformat(doc["updated_at"]),
        )
    if not isinstance(row, list) or len(row) < 8:
        raise TypeError(f"a stats row is a list of at least 8 fields, not {type(row).__name__} {str(row)[:60]}")
    mean, m2, samples, attempts, successes, cf, vf, updated = row[:8]
    run_row = row[12] if len(row) >= 13 and row[12] else None
    if len(row) >= 12:
        weight, ok_weight, fail_weight, clients = row[8], row[9], row[10], row[11]
    else:  # written before weights existed: every outcome counts once, from one unnamed client
        weight, ok_weight, fail_weight = float(samples), float(samples), float(cf + vf)
        clients = {"": [float(samples), mean, m2]} if samples else {}
    if len(row) >= 14:
        rates = row[13]
    else:  # written before rates were kept per client: one unnamed client holds them all
        rates = {"": [float(ok_weight), float(fail_weight)]} if ok_weight or fail_weight else {}
    if validate:
        run = None if run_row is None else dict(zip(("client", "cusum", "n", "mean"), run_row, strict=True))
        return Score.model_validate(dict(
            state_id=state_id, optimization_id=opt_id, arch=arch, track=track, mean_log_speedup=mean,
            m2_log_speedup=m2, samples=samples, attempts=attempts, successes=successes, compile_failures=cf,
            verify_failures=vf, weight=weight, ok_weight=ok_weight, fail_weight=fail_weight, clients=clients,
            rates=rates, run=run, prior=False, prior_mean_log_speedup=pm, prior_weight=pw, updated_at=updated,
        ))
    return Score.model_construct(
        state_id=state_id, optimization_id=opt_id, arch=arch, track=track, mean_log_speedup=mean, m2_log_speedup=m2,
        samples=samples, attempts=attempts, successes=successes, compile_failures=cf, verify_failures=vf,
        weight=weight, ok_weight=ok_weight, fail_weight=fail_weight, clients=clients, rates=rates,
        run=None if run_row is None else ChangeRun.model_construct(client=run_row[0], cusum=run_row[1], n=run_row[2],
                                                                   mean=run_row[3]),
        prior=False, prior_mean_log_speedup=pm, prior_weight=pw, updated_at=datetime.fromisoformat(updated),
    )


class Tables:
    """All KB records of one file version, plus indexes; edited only through `apply`."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.records: dict[str, dict[str, dict[str, Any]]] = {t: {} for t in RECORD_TABLES}
        self.scores: dict[ScoreKey, ScoreDoc] = {}
        # indexes
        self.states_by_key: dict[str, list[str]] = {}
        self.score_keys: dict[str, set[tuple[str, str]]] = {}  # state -> {(arch, track)}
        self.calibration: dict[str, list[float]] = {}  # track -> CALIBRATION_FIELDS sums over pooled scores
        self.lessons_by_pair: dict[tuple[str, str], list[str]] = {}
        self.transitions_by_state: dict[str, list[str]] = {}
        self.verdicts_by_candidate: dict[str, list[str]] = {}
        self.outcomes_by_candidate: dict[str, list[str]] = {}  # a kernel's lineage (policy.lineage)
        self.verdicts_by_problem: dict[str, list[str]] = {}  # a problem's first kernels (policy.lineage)
        # client -> {verdict key: candidate} of this KB's own verdicts naming that client as their one
        # verifier: read on every verification (`KBView.sole_candidates`), so never a scan of every verdict
        self.verdicts_by_sole_verifier: dict[str, dict[str, str]] = {}
        # candidate -> how many times outcomes and lessons name it (`names_of`): asked under the KB lock
        # on every verification (`tools.candidate_store.Needs`), so never a scan of every outcome and lesson
        self.names_by_candidate: dict[str, int] = {}
        # problem -> the verdict a composition takes (`kb.composition`): asked under the KB lock on every
        # verification (`tools.candidate_store.Needs`), so never a validation of every verdict of a problem
        self.picks = Picks(self.records["candidates"], self.verdicts_by_problem, self.verdicts_by_candidate)

    # ---- loading and saving -------------------------------------------------------------

    @classmethod
    def from_tinydb(cls, data: Any, where: str) -> Tables:
        """Builds tables from a parsed TinyDB file; raises LayoutError if it is not a kb-mcp KB."""
        if not isinstance(data, dict):
            raise LayoutError(f"{where}: top level is {type(data).__name__}, not a JSON object of tables")
        metas = data.get("meta")
        if not isinstance(metas, dict) or len(metas) != 1:
            raise LayoutError(f"{where}: no kb-mcp 'meta' table (tables found: {sorted(data)[:8]})")
        meta = next(iter(metas.values()))
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise LayoutError(f"{where}: the 'meta' table does not mark a kb-mcp KB (format={meta.get('format')!r})")
        check_schema(meta, where)  # before its records: a newer layout is not a malformed one
        unknown = sorted(name for name, docs in data.items() if name not in TABLES and docs)
        if unknown:  # a compaction would write the file without them
            raise KBNewerFormatError(f"KB tables {unknown}", where=where)
        t = cls()
        t.meta = dict(meta)
        try:
            for table in RECORD_TABLES:
                docs = data.get(table, {})
                if not isinstance(docs, dict):
                    raise LayoutError(f"{where}: table {table!r} is not a JSON object")
                for doc in docs.values():
                    t._put(table, _record_key(table, doc), doc)
            for doc in data.get("scores", {}).values():
                track = doc_track(doc)
                Track(track)  # an unknown track is a malformed record, not a silent new key
                key = (doc["state_id"], doc["arch"], track)
                doc.setdefault("priors", {})
                doc.setdefault("stats", {})
                doc.setdefault("updated_at", t.meta.get("created_at", "1970-01-01T00:00:00+00:00"))
                t.scores[key] = doc
                t.score_keys.setdefault(key[0], set()).add((key[1], key[2]))
                if key[1] == ALL_ARCH:
                    for opt, row in doc["stats"].items():
                        t._calibrate(track, _row_terms(doc["priors"].get(opt), row), +1)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise LayoutError(f"{where}: malformed record ({type(exc).__name__}: {exc})") from exc
        return t

    def to_tinydb(self) -> dict[str, dict[str, Any]]:
        """The TinyDB file content: every table as {doc_id: document}."""
        out: dict[str, dict[str, Any]] = {"meta": {"1": self.meta}}
        for table in RECORD_TABLES:
            out[table] = {str(i): doc for i, doc in enumerate(self.records[table].values(), 1)}
        out["scores"] = {str(i): doc for i, doc in enumerate(self.scores.values(), 1)}
        return out

    # ---- the one way to change anything ---------------------------------------------------

    def apply(self, op: KBOp) -> None:
        """Applies one change (kb.ops)."""
        if isinstance(op, PutRecord):
            self._put(op.table, op.key, op.doc)
        elif isinstance(op, DropRecord):
            self._drop_record(op.table, op.key)
        elif isinstance(op, PutMeta):
            self.meta = dict(op.meta)
        else:
            self._put_score(op)

    def replay(self, wire_ops: Iterable[list[Any]]) -> None:
        """Applies changes read from the journal, in order (a malformed one raises)."""
        for wire in wire_ops:
            self.apply(from_wire(wire))

    def _put_score(self, op: PutScore) -> None:
        key = (op.state_id, op.arch, op.track)
        doc = self.scores.get(key)
        if doc is None:
            doc = {"state_id": op.state_id, "arch": op.arch, "updated_at": op.when, "priors": {}, "stats": {}}
            if op.track != FP32:
                doc["track"] = op.track
            self.scores[key] = doc
            self.score_keys.setdefault(op.state_id, set()).add((op.arch, op.track))
        if op.arch == ALL_ARCH:  # the track's calibration follows its pooled scores
            self._calibrate(op.track, _row_terms(doc["priors"].get(op.optimization_id),
                                                 doc["stats"].get(op.optimization_id)), -1)
            self._calibrate(op.track, _row_terms(op.prior, op.row), +1)
        doc["priors"][op.optimization_id] = op.prior
        if op.row is None:
            doc["stats"].pop(op.optimization_id, None)
            doc["updated_at"] = op.when
        else:
            doc["stats"][op.optimization_id] = op.row

    def _calibrate(self, track: str, terms: tuple[float, ...] | None, sign: int) -> None:
        if terms is None:
            return
        sums = self.calibration.setdefault(track, [0.0] * len(CALIBRATION_FIELDS))
        for i, x in enumerate(terms):
            sums[i] += sign * x

    def _put(self, table: str, key: str, doc: dict[str, Any]) -> None:
        recs = self.records[table]
        if key in recs:
            if table == "candidates":
                doc = _with_earlier_verifiers(doc, recs[key])
            self._unindex(table, key, recs[key])
        recs[key] = doc
        self._index(table, key, doc)

    def _drop_record(self, table: str, key: str) -> None:
        doc = self.records[table].pop(key, None)
        if doc is not None:
            self._unindex(table, key, doc)

    def _index(self, table: str, key: str, doc: dict[str, Any]) -> None:
        for cid in names_of(table, doc):
            self.names_by_candidate[cid] = self.names_by_candidate.get(cid, 0) + 1
        if table == "states":
            self.states_by_key.setdefault(signature_key(doc), []).append(key)
        elif table == "lessons":
            self.lessons_by_pair.setdefault((doc["state_id"], doc["optimization_id"]), []).append(key)
        elif table == "transitions":
            self.transitions_by_state.setdefault(doc["state_id"], []).append(key)
        elif table == "candidates":
            self.verdicts_by_candidate.setdefault(doc["candidate_id"], []).append(key)
            self.verdicts_by_problem.setdefault(doc.get("problem_hash", ""), []).append(key)
            sole = sole_verifier(doc)
            if sole is not None:
                self.verdicts_by_sole_verifier.setdefault(sole, {})[key] = doc["candidate_id"]
            self.picks.added(key, doc)
        elif table == "outcomes":
            self.outcomes_by_candidate.setdefault(doc["candidate_id"], []).append(key)

    def _unindex(self, table: str, key: str, doc: dict[str, Any]) -> None:
        for cid in names_of(table, doc):
            left = self.names_by_candidate.get(cid, 0) - 1
            if left > 0:
                self.names_by_candidate[cid] = left
            else:
                self.names_by_candidate.pop(cid, None)
        if table == "candidates":
            self.picks.removed(key, doc)
            _drop(self.verdicts_by_problem, doc.get("problem_hash", ""), key)
            sole = sole_verifier(doc)
            if sole is not None and sole in self.verdicts_by_sole_verifier:
                self.verdicts_by_sole_verifier[sole].pop(key, None)
                if not self.verdicts_by_sole_verifier[sole]:
                    del self.verdicts_by_sole_verifier[sole]
        index: dict[Any, list[str]] | None = None
        group: Any = None
        if table == "states":
            index, group = self.states_by_key, signature_key(doc)
        elif table == "lessons":
            index, group = self.lessons_by_pair, (doc["state_id"], doc["optimization_id"])
        elif table == "transitions":
            index, group = self.transitions_by_state, doc["state_id"]
        elif table == "candidates":
            index, group = self.verdicts_by_candidate, doc["candidate_id"]
        elif table == "outcomes":
            index, group = self.outcomes_by_candidate, doc["candidate_id"]
        if index is not None:
            _drop(index, group, key)

    # ---- raw reads --------------------------------------------------------------------------

    def score_doc(self, state_id: str, arch: str = ALL_ARCH, track: str = FP32) -> ScoreDoc | None:
        """The score document of (state, arch, track), if any."""
        return self.scores.get((state_id, arch, track))


def _with_earlier_verifiers(doc: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """A verdict stored again under its key (the same source verified again with the same options on the
    same GPU, by any client) keeps the clients that verified it before: each of them still produced it
    (`CandidateRecord.verified_by`). Applied here, so a verdict that waited on disk for the lock keeps them too."""
    before = earlier.get("verified_by") or []
    if not before or earlier.get("imported_from"):  # another file's clients never verified it here
        return doc
    return {**doc, "verified_by": list(dict.fromkeys([*before, *(doc.get("verified_by") or [])]))}


def sole_verifier(doc: dict[str, Any]) -> str | None:
    """The one client a stored verdict names as its verifier, or None: several, none (written before
    verifiers were kept), or a verdict merged in from another KB file (its clients never verified it here)."""
    who = doc.get("verified_by")
    if doc.get("imported_from") or not isinstance(who, list) or len(who) != 1 or not isinstance(who[0], str):
        return None
    return who[0]


def names_of(table: str, doc: dict[str, Any]) -> list[str]:
    """The candidates a stored record names, once per field: an outcome its candidate and its parent, a
    lesson its candidate; none for other tables. A field that holds no candidate id (absent, empty, not a
    string: a KB file is untrusted) names none."""
    fields = {"outcomes": ("candidate_id", "parent_candidate_id"), "lessons": ("candidate_id",)}.get(table, ())
    return [cid for cid in (doc.get(f) for f in fields) if isinstance(cid, str) and cid]


def _drop(index: dict[Any, list[str]], group: Any, key: str) -> None:
    """`key` out of `index[group]`, and the group out of the index once it is empty."""
    keys = index.get(group, [])
    if key in keys:
        keys.remove(key)
    if not keys:
        index.pop(group, None)


def signature_key(state_doc: dict[str, Any]) -> str:
    """The exact-match key ('primary/secondary') of a stored State document."""
    sig = state_doc["signature"]
    return f"{sig['primary']}/{sig.get('secondary') or '-'}"


def score_op(score: Score, when: str) -> PutScore:
    """The change that stores `score` (time `when` stamps a pure prior's document)."""
    prior, row = encode_score(score)
    return PutScore(score.state_id, score.arch, score.optimization_id, prior, row, when, Track(score.track).value)
