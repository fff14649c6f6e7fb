"""Grouping a traced graph into parts: anchors start parts, epilogues join them, views never make a part."""

from __future__ import annotations

from kb_mcp.decomposition import grouping, ranking
from kb_mcp.decomposition.models import Part, Trace, TracedNode


def node(name: str, op: str, target: str, args: list[str], module_type: str = "", flops: int = 0) -> TracedNode:
    return TracedNode(name=name, op=op, target=target, args=args, module_type=module_type, flops=flops, bytes=100)


def conv_block() -> Trace:
    return Trace(method="fx", built_on="meta", nodes=[
        node("x", "placeholder", "x", []),
        node("conv1", "call_module", "conv1", ["x"], "torch.nn.modules.conv.Conv2d", 1000),
        node("bn1", "call_module", "bn1", ["conv1"], "torch.nn.modules.batchnorm.BatchNorm2d"),
        node("relu", "call_module", "relu", ["bn1"], "torch.nn.modules.activation.ReLU"),
        node("view", "call_method", "view", ["relu"]),
        node("fc", "call_module", "fc", ["view"], "torch.nn.modules.linear.Linear", 500),
        node("add", "call_function", "_operator.add", ["fc", "x"]),
        node("q", "call_function", "torch.matmul", ["add", "add"], flops=50),
        node("s", "call_function", "torch.nn.functional.softmax", ["q"]),
        node("o", "call_function", "torch.matmul", ["s", "add"], flops=50),
        node("output", "output", "output", ["o"]),
    ])


def test_anchors_start_parts_and_epilogues_join_them() -> None:
    groups = grouping.group(conv_block())
    assert [[n.name for n in g.nodes] for g in groups] == [["conv1", "bn1", "relu", "view"], ["fc", "add"],
                                                            ["q", "s", "o"]]
    assert [grouping.part_kind(g) for g in groups] == ["conv", "gemm", "attention"]
    assert grouping.label(groups[0]) == "Conv2d + BatchNorm2d + ReLU"
    assert grouping.assignment(groups)["o"] == 2


def test_a_pointwise_op_on_an_earlier_part_starts_a_chain() -> None:
    trace = conv_block()
    trace.nodes.insert(4, node("sig", "call_function", "torch.sigmoid", ["x"]))
    kinds = [grouping.part_kind(g) for g in grouping.group(trace)]
    assert kinds[:2] == ["conv", "pointwise"]


def test_estimated_shares_sum_to_one_and_follow_the_work() -> None:
    parts = [Part(index=1, name="part01", kind="conv", label="a", nodes=[], flops=10**12, bytes=10**6),
             Part(index=2, name="part02", kind="pointwise", label="b", nodes=[], flops=0, bytes=10**6)]
    ranked = ranking.rank_estimated(parts)
    assert abs(sum(p.share for p in ranked) - 1) < 1e-9
    assert ranked[0].share > 0.9 and ranked[0].share_basis == "estimated"
    assert ranked[0].estimated_us > ranking.estimate_us(0, 10**6)
