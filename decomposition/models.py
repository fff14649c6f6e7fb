"""The records of a decomposition: the traced graph as the worker reports it, the parts, the ranking."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Method = Literal["fx", "export", "whole"]
PartKind = Literal["conv", "gemm", "attention", "norm", "recurrent", "pool", "softmax", "pointwise", "whole"]
ShareBasis = Literal["estimated", "measured"]


class TracedNode(BaseModel):
    """One node of the traced graph (`torch.fx`), with what one run on meta tensors gave."""

    name: str
    op: str  # placeholder, get_attr, call_module, call_function, call_method, output
    target: str
    args: list[str] = Field(default_factory=list)  # the nodes it reads
    module_type: str = ""  # for call_module: the torch.nn class, qualified
    result: Any = None  # {"shape", "dtype"} / {"value"} / a list of them
    flops: int = 0
    bytes: int = 0


class Trace(BaseModel):
    """A model's graph at its real sizes, and how it was obtained."""

    method: Method
    built_on: str  # "meta" or "fake"
    failures: list[str] = Field(default_factory=list)  # why the methods before `method` failed
    nodes: list[TracedNode] = Field(default_factory=list)
    inputs: list[Any] = Field(default_factory=list)
    flops: int = 0  # method "whole" only: the model's own totals
    bytes: int = 0


class PartState(BaseModel):
    """The performance state `classify_state` gave a part's profile (filled where profiled)."""

    state_id: str = ""
    signature: str = ""
    profile_id: str = ""


class Part(BaseModel):
    """A sub-block worth one kernel: its nodes, what it computes, and its share of the model's time."""

    index: int  # 1-based, in the model's order
    name: str  # part01 ...
    kind: PartKind
    label: str  # the ops it holds, e.g. "Conv2d + BatchNorm2d + ReLU"
    nodes: list[str]
    modules: list[str] = Field(default_factory=list)  # the model's torch.nn modules it calls, by name
    parameters: list[str] = Field(default_factory=list)  # state-dict keys it holds
    flops: int = 0
    bytes: int = 0
    estimated_us: float = 0.0
    share: float = 0.0  # of the model's GPU time, 0..1
    share_basis: ShareBasis = "estimated"
    file: str = ""  # the part's problem file, relative to the decomposition folder
    # the first part whose file this one shares: the same computation on the same tensors (an unrolled
    # RNN's steps), so one verdict on that file serves every place of the model that runs it
    same_as: str | None = None
    state: PartState | None = None


class Decomposition(BaseModel):
    """A model decomposed: its parts in model order, and the ranking by share."""

    problem: str
    method: Method
    built_on: str
    failures: list[str] = Field(default_factory=list)
    parts: list[Part]
    share_basis: ShareBasis = "estimated"
    glue: str = ""  # the composed forward: how the parts are called (generated code)
    batch: int | None = None  # the batch it was traced at, where reduced (None: the problem's own)
    shrunk: bool = False  # traced with the problem's sizes divided (a check on a small machine)
    notes: list[str] = Field(default_factory=list)

    def ranked(self) -> list[Part]:
        """The parts by share of the model's time, largest first."""
        return sorted(self.parts, key=lambda p: (-p.share, p.index))

    def by_file(self) -> list[tuple[Part, float, list[str]]]:
        """Each part file once, by the share of the model's time it runs in all its places, largest
        first: (the first part that runs it, that summed share, the other parts that run it)."""
        first = {p.name: p for p in self.parts if p.same_as is None}
        share = dict.fromkeys(first, 0.0)
        others: dict[str, list[str]] = {name: [] for name in first}
        for p in self.parts:
            share[p.same_as or p.name] += p.share
            if p.same_as:
                others[p.same_as].append(p.name)
        return sorted(((first[n], share[n], others[n]) for n in first), key=lambda t: (-t[1], t[0].index))

    def by_layer(self) -> list[tuple[list[Part], float, int]]:
        """The model's layers that run in more than one part file, largest share first: (the first part of
        each file, the share of all their places, how many places). Parts are one layer when they hold
        the same parameters and compute the same kind of op: an RNN's output layer over its steps, say,
        where each step's part also picks its own piece of an input, so no two are the same file and
        `by_file` lists each at a step's small share."""
        groups: dict[tuple[str, str, tuple[str, ...]], tuple[list[Part], float, int]] = {}
        for first, share, others in self.by_file():
            if not first.parameters:
                continue  # no parameters: nothing says two files are one layer
            key = (first.kind, first.label, tuple(sorted(first.parameters)))
            heads, total, places = groups.get(key, ([], 0.0, 0))
            groups[key] = ([*heads, first], total + share, places + 1 + len(others))
        layers = [layer for layer in groups.values() if len(layer[0]) > 1]
        return sorted(layers, key=lambda t: (-t[1], t[0][0].index))
