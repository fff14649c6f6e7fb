"""Second shapes of a problem: copies of its source with its size constants changed (plain Python).

KernelBench problems set their sizes through module-level constants that `get_inputs` and
`get_init_inputs` read (`batch_size = 128`, `in_features = 4096`). A copy of the module with some
of them halved is the same problem at another size; the verify worker loads it, keeps the first
variant whose reference constructs and runs, and checks an escalated candidate there too
(`harness.worker.evidence`). Only integer constants of at least `MIN_SIZE` count as sizes: the
small ones are dimensions, kernel sizes, strides or groups, where another value is another problem.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from kb_mcp.kb import pyparse

__all__ = ["MAX_VARIANTS", "MIN_SIZE", "ShapeVariant", "size_constants", "variants"]

MIN_SIZE = 8
MAX_VARIANTS = 4  # variants tried at most (each costs a reference construction and forward)
_READERS = ("get_inputs", "get_init_inputs")


@dataclass(frozen=True)
class ShapeVariant:
    """The problem's source with some size constants changed."""

    source: str
    changes: tuple[tuple[str, int, int], ...]  # (name, old, new)

    def describe(self) -> str:
        """`batch_size=64 (was 128), ...`"""
        return ", ".join(f"{name}={new} (was {old})" for name, old, new in self.changes)


def _targets(node: ast.stmt) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    return [node.target] if isinstance(node, ast.AnnAssign) else []


def size_constants(source: str) -> dict[str, int]:
    """Module-level integer constants of at least MIN_SIZE that get_inputs/get_init_inputs read,
    in source order (each assigned once, by a plain `NAME = <int>`)."""
    try:
        tree = pyparse.parse(source)
    except SyntaxError:
        return {}
    read: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in _READERS:
            read |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assigned: dict[str, int] = {}
    counts: dict[str, int] = {}
    for node in tree.body:
        targets = _targets(node)
        for t in targets:
            if isinstance(t, ast.Name):
                counts[t.id] = counts.get(t.id, 0) + 1
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and isinstance(value, ast.Constant):
            v = value.value
            if isinstance(v, int) and not isinstance(v, bool) and v >= MIN_SIZE:
                assigned[targets[0].id] = v
    return {name: v for name, v in assigned.items() if name in read and counts.get(name) == 1}


def _rewrite(source: str, new: dict[str, int]) -> str:
    tree = pyparse.parse(source)
    for node in tree.body:
        targets = _targets(node)
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and len(targets) == 1
                and isinstance(targets[0], ast.Name) and targets[0].id in new):
            node.value = ast.Constant(new[targets[0].id])
    return ast.unparse(ast.fix_missing_locations(tree))


def variants(source: str) -> list[ShapeVariant]:
    """Second shapes to try, best first: every size halved, then each size halved alone."""
    sizes = size_constants(source)
    if not sizes:
        return []
    plans = [dict(sizes)] + ([{name: v} for name, v in sizes.items()] if len(sizes) > 1 else [])
    out = []
    for plan in plans[:MAX_VARIANTS]:
        new = {name: v // 2 for name, v in plan.items()}
        out.append(ShapeVariant(_rewrite(source, new), tuple((n, plan[n], new[n]) for n in plan)))
    return out
