"""Grouping a traced graph's nodes into parts worth one kernel each.

A walk in the graph's order: an anchor (a convolution, a GEMM, a recurrent module, an attention
module, a normalisation, a pool) starts a part, and what follows it on its own output joins it as
its epilogue (pointwise ops, reshapes, a residual add, a normalisation after a convolution, a softmax
after a GEMM, and the second matmul of an attention core). Pointwise ops that follow no part start a
pointwise chain. A node only ever joins the newest part, so parts run in the model's order and each
reads only what the model and earlier parts computed (no cycle between parts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kb_mcp.decomposition.models import PartKind, Trace, TracedNode

MODULE_KINDS: list[tuple[str, str]] = [
    (r"Conv(Transpose)?\d?d$|LazyConv", "conv"), (r"^Linear$|Bilinear$", "gemm"),
    (r"BatchNorm|LayerNorm|GroupNorm|InstanceNorm|LocalResponseNorm|RMSNorm", "norm"),
    (r"^(LSTM|GRU|RNN)(Cell)?$", "recurrent"), (r"MultiheadAttention|Transformer", "attention"),
    (r"Pool", "pool"), (r"Softmax|Softmin", "softmax"),
    (r"^(Dropout\w*|Identity|Flatten|Unflatten|ChannelShuffle|PixelShuffle)$", "shape"),
]
FUNCTION_KINDS: list[tuple[str, str]] = [
    (r"^(conv\w*|convolution)$", "conv"), (r"^(linear|addmm)$", "gemm"),
    (r"^(matmul|mm|bmm|baddbmm|einsum|__matmul__)$", "matmul"),
    (r"norm", "norm"), (r"scaled_dot_product_attention", "attention"),
    (r"softmax|softmin", "softmax"), (r"pool", "pool"), (r"^(lstm|gru|rnn)\w*$", "recurrent"),
    (r"^(view|reshape|permute|transpose|flatten|contiguous|size|getitem|unsqueeze|squeeze|expand|expand_as|chunk|"
     r"split|split_with_sizes|cat|concat|stack|t|_unsafe_view|clone|slice|select|getattr|dim|to|type_as|narrow|unbind|"
     r"alias|detach|dropout|lift_fresh_copy|_assert_tensor_metadata|sym_size|repeat|flip|roll|pad|constant_pad_nd|"
     r"index_select|unfold|movedim|pixel_shuffle|channel_shuffle|zeros|ones|empty|arange|new_zeros|full)$", "shape"),
    (r"^(sum|mean|amax|amin|max|min|var|std|cumsum|prod|logsumexp|argmax|norm)$", "reduction"),
]
ANCHORS = {"conv", "gemm", "matmul", "recurrent", "attention", "norm", "pool"}
LABELS = {"matmul": "matmul", "shape": "view", "reduction": "reduce"}


def _short(node: TracedNode) -> str:
    """The op's own name: `torch.nn.modules.conv.Conv2d` -> Conv2d, `aten.relu.default` -> relu."""
    if node.op == "call_module":
        return node.module_type.rsplit(".", 1)[-1]
    name = node.target
    if name.startswith("aten."):
        return name.split(".")[1]
    return name.rsplit(".", 1)[-1]


def kind_of(node: TracedNode) -> str:
    """What a node computes: an anchor kind, pointwise, reduction or shape (free)."""
    name = _short(node)
    if node.op in ("placeholder", "get_attr", "output"):
        return "shape"
    table = MODULE_KINDS if node.op == "call_module" else FUNCTION_KINDS
    for pattern, kind in table:
        if re.search(pattern, name if node.op == "call_module" else name.lower()):
            return kind
    return "pointwise"


@dataclass
class Group:
    """A part being formed: its main kind and nodes."""

    kind: str
    nodes: list[TracedNode] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)

    def add(self, node: TracedNode, kind: str) -> None:
        self.nodes.append(node)
        self.kinds.append(kind)

    @property
    def free(self) -> bool:
        """Nothing but reshapes and views: no kernel of its own."""
        return all(k == "shape" for k in self.kinds) and not any(n.flops for n in self.nodes)


def _joins(kind: str, last: Group | None, fed: bool) -> bool:
    """Whether a node of `kind` that reads the newest part (`fed`) joins it."""
    if last is None:
        return False
    if kind == "shape":
        return True  # a view costs nothing where it goes; the newest part keeps the order
    if not fed:
        return False
    if kind in ("pointwise", "reduction"):
        return True
    if kind == "norm":
        return last.kind == "conv" and "norm" not in last.kinds
    if kind == "softmax":
        return last.kind in ("matmul", "gemm", "attention") and "softmax" not in last.kinds
    if kind == "matmul":  # the second matmul of an attention core: scores, (scale, mask, softmax), values
        return last.kind == "matmul" and last.kinds.count("matmul") == 1 and len(set(last.kinds) - {"shape"}) > 1
    return False


def group(trace: Trace) -> list[Group]:
    """The trace's compute nodes grouped into parts, in the model's order."""
    groups: list[Group] = []
    where: dict[str, int] = {}
    attrs = [n for n in trace.nodes if n.op == "get_attr"]
    for node in trace.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        kind = kind_of(node)
        last = groups[-1] if groups else None
        fed = bool(groups) and (len(groups) - 1) in {where[a] for a in node.args if a in where}
        if not _joins(kind, last, fed):
            groups.append(Group(kind="pointwise" if kind in ("shape", "reduction") else kind))
        groups[-1].add(node, kind)
        where[node.name] = len(groups) - 1
    groups = _fold_free(groups)
    where = {n.name: i for i, g in enumerate(groups) for n in g.nodes}
    for attr in attrs:  # a parameter or buffer goes with the first part that reads it
        users = [where[n.name] for n in trace.nodes if attr.name in n.args and n.name in where]
        groups[min(users) if users else 0].nodes.insert(0, attr)
        groups[min(users) if users else 0].kinds.insert(0, "shape")
    for g in groups:
        if g.kind == "matmul":
            g.kind = "attention" if "softmax" in g.kinds or g.kinds.count("matmul") > 1 else "gemm"
    return groups


def _fold_free(groups: list[Group]) -> list[Group]:
    """Free groups (views only) folded into the next part (or the previous one, at the end)."""
    out: list[Group] = []
    pending: list[Group] = []
    for g in groups:
        if g.free:
            pending.append(g)
            continue
        for p in pending:
            g.nodes[:0], g.kinds[:0] = p.nodes, p.kinds
        pending = []
        out.append(g)
    for p in pending:
        if out:
            out[-1].nodes += p.nodes
            out[-1].kinds += p.kinds
        else:
            out.append(p)
    return out


def assignment(groups: list[Group]) -> dict[str, int]:
    """Node name -> part number (0-based), as the worker's split reads it."""
    return {n.name: i for i, g in enumerate(groups) for n in g.nodes}


def label(g: Group) -> str:
    """The ops a part holds, in order, each once: `Conv2d + BatchNorm2d + ReLU`."""
    seen: list[str] = []
    for node, kind in zip(g.nodes, g.kinds):
        if kind == "shape" or node.op == "get_attr":
            continue
        name = _short(node)
        if name not in seen:
            seen.append(name)
    text = " + ".join(seen[:5]) + (f" + {len(seen) - 5} more" if len(seen) > 5 else "")
    return text or "views"


def part_kind(g: Group) -> PartKind:
    """The part's kind as the records name it."""
    kind = g.kind if g.kind in ("conv", "gemm", "attention", "norm", "recurrent", "pool", "softmax") else "pointwise"
    return kind  # type: ignore[return-value]
