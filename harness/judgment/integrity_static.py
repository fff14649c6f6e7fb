"""Static integrity checks on candidate source: evidence with line numbers, from the syntax tree.

Plain Python (no torch import), so the server can run them before a worker is involved. Names are
resolved through the file's own imports and aliases (`import torch.nn.functional as F`,
`mm = torch.matmul`), comments and docstrings are never read as code, and a statement such as
`pass` or a re-raising `except` is never a finding by itself. C++/CUDA source held in string
constants is scanned with comments stripped. The parts live in `harness.judgment.static` (vocabulary, C++
rules, names, the forward-path and whole-file checks); this module runs them.

These checks are evidence, not the whole defence: a determined candidate can hide a call from any
parser (`getattr(torch, "mat" + "mul")`), which is why the runtime guards in
`harness.integrity_runtime` watch what actually executes. Every finding here names the line and
says what to change.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable, Iterator

from kb_mcp.harness.judgment.static.cpp import check_strings, looks_like_cpp
from kb_mcp.harness.judgment.static.file_checks import FileVisitor
from kb_mcp.harness.judgment.static.forward import ForwardVisitor
from kb_mcp.harness.judgment.static.names import (
    Context,
    collect_defs,
    collect_extensions,
    collect_imports,
    nn_module_attrs,
    qualname,
    reachable_from_forward,
)
from kb_mcp.harness.judgment.static.vocabulary import ALLOW_GROUPS, COMPUTE_OPS, TENSOR_METHODS, expand_allow
from kb_mcp.harness.judgment.verdict import Finding, FindingCode
from kb_mcp.kb import pyparse

__all__ = ["ALLOW_GROUPS", "COMPUTE_OPS", "TENSOR_METHODS", "check_source", "expand_allow", "iter_cuda_sources"]


def _is_main_guard(stmt: ast.stmt) -> bool:
    """`if __name__ == "__main__":` — code there never runs inside the harness."""
    test = getattr(stmt, "test", None)
    return (
        isinstance(stmt, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
    )


def check_source(source: str, allow: Collection[str] = (), composed: bool = False) -> list[Finding]:
    """Static findings for a candidate's source, each with a line number and an actionable message.

    `allow` is an allow-list (see `expand_allow`): e.g. `["gemm"]` permits torch.matmul, F.linear,
    nn.Linear and cuBLAS for GEMM problems. A file that does not parse yields no findings here: the
    compile step reports syntax errors with their own verdict. `composed` (composed mode): PyTorch
    compute ops on the forward path are left to the runtime, which compares them with the ops the
    reference itself runs; library compilers, other libraries and everything else are checked as ever.
    """
    try:
        tree = pyparse.parse(source)
    except SyntaxError:
        return []
    tree.body = [stmt for stmt in tree.body if not _is_main_guard(stmt)]
    ctx = Context(allow=expand_allow(allow), composed=composed)
    collect_imports(tree, ctx)
    collect_defs(tree, ctx)
    collect_extensions(tree, ctx)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    FileVisitor(ctx, parents).visit(tree)
    check_strings(tree, ctx, parents)
    model = ctx.classes.get("ModelNew")
    if model is not None:
        for base in model.bases:
            qn = qualname(base, ctx.aliases) or ""
            if qn.rsplit(".", 1)[-1] == "Model" and isinstance(base, ast.Attribute):
                ctx.add(
                    FindingCode.reference_fallback,
                    model.lineno,
                    f"line {model.lineno}: ModelNew subclasses the reference `{qn}`; it must compute the "
                    "result itself",
                )
        visitor = ForwardVisitor(ctx, nn_module_attrs(model, ctx))
        for fn in reachable_from_forward(ctx):
            visitor.visit(fn)
    return _dedupe(ctx.findings)


def _dedupe(findings: Iterable[Finding]) -> list[Finding]:
    seen: set[tuple[str, int | None, str]] = set()
    out: list[Finding] = []
    for f in findings:
        key = (f.code.value, f.line, f.message)
        if key not in seen:
            seen.add(key)
            out.append(f)
    out.sort(key=lambda f: (f.line or 0, f.code.value))
    return out


def iter_cuda_sources(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each string constant in the file that looks like C++/CUDA source."""
    try:
        tree = pyparse.parse(source)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and looks_like_cpp(node.value):
            yield node.lineno, node.value
