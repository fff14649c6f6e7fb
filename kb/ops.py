"""The changes that edit a KB ("ops"), typed, and their wire form in the journal.

A transaction records the ops it made; the store appends them to the journal as one line of JSON
lists (``["put", table, key, doc]``, ``["drop", table, key]``, ``["score", state, arch, optimization,
prior, row, time(, track)]``), and a process that replays the journal turns each list back into its op. The wire form
is the file format: it stays readable by earlier versions (a score op on the fp32 track is written
without its track, as before tracks existed). A "drop" (a record removed: a verdict beyond its
client's bound, `tools.candidate_store.trim`) is read only by versions that write it, so every server of a
shared KB is upgraded together.

`from_wire` is where a reader tells a newer kb-mcp's op from damage: a name this version does not know
where it expects one (an op kind, a table, a track) or more fields than it knows an op to have raise
`KBNewerFormatError` (upgrade kb-mcp; the KB is not damaged), while what no kb-mcp writes (a list too
short, a name that is not a string) raises ValueError and the like, which readers call damage. A line
reaches `from_wire` only once its checksum holds (`kb.journal`), so an unknown name there was written by
a kb-mcp, not by a flipped bit. (Versions before this rule called a newer op a damaged line.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kb_mcp.kb.errors import KBNewerFormatError
from kb_mcp.kb.models import DEFAULT_TRACK, Track

__all__ = ["FP32", "DropRecord", "KBOp", "PutMeta", "PutRecord", "PutScore", "from_wire", "newer_op"]

FP32 = DEFAULT_TRACK.value
RECORD_TABLES = ("states", "optimizations", "lessons", "outcomes", "transitions", "candidates")
TRACKS = tuple(t.value for t in Track)


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


_FIELDS = {"put": 4, "drop": 3, "score": 8}  # the most fields this version knows each op kind to have


def from_wire(op: list[Any]) -> KBOp:
    """The op of one journal list. Raises KBNewerFormatError for an op of a newer kb-mcp (a kind, table
    or track this version does not know, or more fields than it knows), ValueError (or a KeyError,
    TypeError or IndexError) for a malformed list."""
    if not isinstance(op, list) or not op:
        raise ValueError(f"a KB change is a list of fields, not {str(op)[:80]}")
    kind = op[0]
    if not isinstance(kind, str):
        raise ValueError(f"a KB change's kind is {type(kind).__name__}, not a name")
    if kind not in _FIELDS:
        raise KBNewerFormatError(f"a KB change of kind {kind!r}")
    if len(op) > _FIELDS[kind]:
        raise KBNewerFormatError(f"a {kind!r} KB change of {len(op)} fields (this kb-mcp knows {_FIELDS[kind]})")
    if kind == "put" and op[1] == "meta":
        return PutMeta(dict(op[3]))
    if kind == "score":
        track = _known(op[7], TRACKS, "track") if len(op) > 7 else FP32
        return PutScore(op[1], op[2], op[3], list(op[4]), None if op[5] is None else list(op[5]), op[6], track)
    table = _known(op[1], RECORD_TABLES, "table")
    if kind == "put":
        return PutRecord(table, str(op[2]), dict(op[3]))
    return DropRecord(table, str(op[2]))


def _known(name: Any, known: Iterable[str], what: str) -> str:
    """`name` when it is one of `known`; a name that is not is a newer kb-mcp's, anything else malformed."""
    if not isinstance(name, str):
        raise ValueError(f"a KB {what} is {type(name).__name__}, not a name")
    if name not in known:
        raise KBNewerFormatError(f"a KB {what} {name!r}")
    return name


def newer_op(wire_ops: Iterable[Any]) -> KBNewerFormatError | None:
    """The refusal of the first op in `wire_ops` that a newer kb-mcp wrote, or None. Malformed ops are
    passed over: they are damage, which the reader's own checks refuse."""
    for wire in wire_ops:
        try:
            from_wire(wire)
        except KBNewerFormatError as exc:
            return exc
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            continue
    return None
