"""The changes that edit a KB ("ops"), typed, and their wire form in the journal.

A transaction records the ops it made; the store appends them to the journal as one line of JSON
lists (``["put", table, key, doc]``, ``["drop", table, key]``, ``["score", state, arch, optimization,
prior, row, time(, track)]``), and a process that replays the journal turns each list back into its op. The wire form
is the file format: it stays readable by earlier versions (a score op on the fp32 track is written
without its track, as before tracks existed). A "drop" (a record removed: a verdict beyond its
client's bound, `tools.candidate_store.trim`) is read only by versions that write it: an earlier one
calls the line malformed, so every server of a shared KB is upgraded together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kb_mcp.kb.models import DEFAULT_TRACK, Track

__all__ = ["FP32", "DropRecord", "KBOp", "PutMeta", "PutRecord", "PutScore", "from_wire"]

FP32 = DEFAULT_TRACK.value
RECORD_TABLES = ("states", "optimizations", "lessons", "outcomes", "transitions", "candidates")


@dataclass(frozen=True, slots=True)
class PutRecord:
    """Adds or replaces one record of `table` under its natural key."""

    table: str
    key: str
    doc: dict[str, Any]

    def wire(self) -> list[Any]:
        """The journal's form of this op."""
        return ["put", self.table, self.key, self.doc]


@dataclass(frozen=True, slots=True)
class DropRecord:
    """Removes one record of `table` by its natural key (nothing when there is none)."""

    table: str
    key: str

    def wire(self) -> list[Any]:
        """The journal's form of this op."""
        return ["drop", self.table, self.key]


@dataclass(frozen=True, slots=True)
class PutMeta:
    """Replaces the KB's meta record."""

    meta: dict[str, Any]

    def wire(self) -> list[Any]:
        """The journal's form of this op."""
        return ["put", "meta", "meta", self.meta]


@dataclass(frozen=True, slots=True)
class PutScore:
    """Sets one optimization's score in the (state, arch, track) document: its prior pair
    `[prior_mean_log_speedup, prior_weight]` and its statistics row (None for a pure prior)."""

    state_id: str
    arch: str
    optimization_id: str
    prior: list[float]
    row: list[Any] | None
    when: str  # stamps the document when the score is a pure prior
    track: str = FP32

    def wire(self) -> list[Any]:
        """The journal's form of this op (the track is left out on fp32)."""
        op = ["score", self.state_id, self.arch, self.optimization_id, self.prior, self.row, self.when]
        return op if self.track == FP32 else [*op, self.track]


KBOp = PutRecord | DropRecord | PutMeta | PutScore


def from_wire(op: list[Any]) -> KBOp:
    """The op of one journal list; raises ValueError (or a KeyError/TypeError/IndexError on a
    malformed list) when it is not one."""
    kind = op[0]
    if kind == "put" and op[1] == "meta":
        return PutMeta(dict(op[3]))
    if kind == "put":
        if op[1] not in RECORD_TABLES:
            raise ValueError(f"unknown KB table {op[1]!r}")
        return PutRecord(op[1], str(op[2]), dict(op[3]))
    if kind == "drop":
        if op[1] not in RECORD_TABLES:
            raise ValueError(f"unknown KB table {op[1]!r}")
        return DropRecord(op[1], str(op[2]))
    if kind == "score":
        track = op[7] if len(op) > 7 else FP32
        Track(track)  # an unknown track is a malformed op, not a silent new key
        return PutScore(op[1], op[2], op[3], list(op[4]), None if op[5] is None else list(op[5]), op[6], track)
    raise ValueError(f"unknown KB change {kind!r}")
