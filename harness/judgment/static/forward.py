"""The checks of code reachable from `ModelNew.forward`: PyTorch compute ops and try/except
fallbacks."""

from __future__ import annotations

import ast
import sys
from typing import TypeAlias

from kb_mcp.harness.judgment.static.names import Context, layer_op, names_bound, qualname, root_name
from kb_mcp.harness.judgment.static.vocabulary import COMPUTE_OPS, LOGGING_CALLS, TENSOR_METHODS, TORCH_ALLOWED_CALLS
from kb_mcp.harness.judgment.verdict import FindingCode

if sys.version_info >= (3, 11):
    TryNode: TypeAlias = ast.Try | ast.TryStar
else:
    TryNode: TypeAlias = ast.Try


class ForwardVisitor(ast.NodeVisitor):
    """Checks code reachable from ModelNew.forward: library calls and try/except fallbacks."""

    def __init__(self, ctx: Context, nn_attrs: dict[str, str]) -> None:
        self.ctx = ctx
        self.nn_attrs = nn_attrs
        self.locals: set[str] = set()  # names the function being visited binds itself

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer = self.locals
        self.locals = names_bound(node)
        try:
            self.generic_visit(node)
        finally:
            self.locals = outer

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._visit_function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._visit_function(node)

    def _own_extension(self, node: ast.AST) -> bool:
        """True when `node` is the candidate's own built module or kernel (not a tensor)."""
        ctx = self.ctx
        if isinstance(node, ast.Name):
            return node.id in ctx.extensions and node.id not in self.locals
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return node.attr in ctx.extension_attrs
        if isinstance(node, ast.Call):
            callee = node.func
            if isinstance(callee, ast.Name):
                return callee.id in ctx.extension_functions and callee.id not in self.locals
            if isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Name) and callee.value.id == "self":
                return callee.attr in ctx.extension_functions
        return False

    def _library(self, line: int, what: str, op: str) -> None:
        if op in self.ctx.allow or self.ctx.composed:
            return
        self.ctx.add(
            FindingCode.library_call,
            line,
            f"line {line}: the forward path calls {what}, a PyTorch compute op, not a kernel of your "
            f"own; compute it in your kernel (allocation, views and launches are fine), or run with an "
            f"allow-list that permits `{op}`",
        )

    def visit_Call(self, node: ast.Call) -> None:
        qn = qualname(node.func, self.ctx.aliases) or ""
        func = node.func
        if qn.startswith("torch.nn.functional."):
            self._library(node.lineno, f"`{qn}`", qn.rsplit(".", 1)[-1])
        elif qn.startswith(("torch.ops.aten.", "torch._C._nn.", "torch._C._VariableFunctions.")):
            self._library(node.lineno, f"`{qn}`", qn.split(".")[3] if qn.count(".") >= 3 else qn)
        elif qn.startswith(("torch.special.", "torch.linalg.", "torch.fft.")):
            self._library(node.lineno, f"`{qn}`", qn.rsplit(".", 1)[-1])
        elif qn.startswith("torch.") and qn.count(".") == 1:
            name = qn.split(".")[1]
            if name not in TORCH_ALLOWED_CALLS and (name in COMPUTE_OPS or name in _TORCH_OP_GUESS):
                self._library(node.lineno, f"`{qn}`", name)
        if isinstance(func, ast.Call):  # `nn.ReLU()(x)`: a layer built and called on the spot
            inner = qualname(func.func, self.ctx.aliases) or ""
            if inner.startswith("torch.nn.") and inner.rsplit(".", 1)[-1][:1].isupper():
                layer = inner.rsplit(".", 1)[-1]
                self._library(node.lineno, f"the PyTorch layer `nn.{layer}`", layer_op(layer))
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
            and func.attr in self.nn_attrs
        ):
            layer = self.nn_attrs[func.attr]
            self._library(node.lineno, f"`self.{func.attr}`, a PyTorch `nn.{layer}` layer", layer_op(layer))
        elif (
            isinstance(func, ast.Attribute)
            and func.attr in TENSOR_METHODS
            and not (qualname(func.value, self.ctx.aliases) or "").startswith("torch")
            and root_name(func.value) not in self.ctx.modules
            and not self._own_extension(func.value)  # `_ext.relu(x)`: a function of its own extension
        ):
            self._library(node.lineno, f"the tensor method `.{func.attr}()`", func.attr)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self._library(node.lineno, "the `@` operator (torch.matmul)", "matmul")
        self.generic_visit(node)

    def _check_try(self, node: TryNode) -> None:
        for handler in node.handlers:
            fallback = _fallback_in(handler.body)
            if fallback is not None:
                self.ctx.add(
                    FindingCode.reference_fallback,
                    handler.lineno,
                    f"line {handler.lineno}: an `except` on the forward path {fallback} instead of "
                    "re-raising; a failing kernel must fail the verdict, not fall back to other code. "
                    "Remove the try/except or re-raise",
                )
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        self._check_try(node)

    if sys.version_info >= (3, 11):

        def visit_TryStar(self, node: ast.TryStar) -> None:
            self._check_try(node)


def _fallback_in(body: list[ast.stmt]) -> str | None:
    """Describes the fallback an except-body performs, or None if it only re-raises/logs/passes."""
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Raise):
                continue
            if isinstance(node, ast.Return) and node.value is not None:
                return "returns a value"
            if isinstance(node, (ast.Yield, ast.YieldFrom)):
                return "yields a value"
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in LOGGING_CALLS:
                    continue
                if _inside_raise(node, stmt):
                    continue
                return f"calls `{ast.unparse(node.func)}`"
    return None


def _inside_raise(node: ast.AST, stmt: ast.stmt) -> bool:
    return any(isinstance(r, ast.Raise) and node in ast.walk(r) for r in ast.walk(stmt))


# Lower-case `torch.X` names that are compute ops but not in COMPUTE_OPS under that spelling.
_TORCH_OP_GUESS: frozenset[str] = frozenset(
    {"add", "max", "min", "stack", "cat", "concat", "concatenate", "split", "chunk", "any", "all", "eq",
     "ne", "lt", "le", "gt", "ge", "isclose", "allclose", "equal", "isnan", "isfinite", "isinf", "nonzero",
     "count_nonzero", "bincount", "histc", "unique", "searchsorted", "bucketize", "diff", "cummax", "cummin",
     "randn", "rand", "randint", "randn_like", "rand_like", "normal", "bernoulli",
     "multinomial", "arange", "linspace", "logspace", "eye", "diag", "diagonal", "trace", "det", "inverse",
     "pinverse", "svd", "qr", "cholesky", "lu", "solve", "addr", "cosine_similarity", "dist", "renorm",
     "std", "var", "nan_to_num", "heaviside", "logical_and", "logical_or", "logical_not", "logical_xor",
     "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "floor_divide", "true_divide", "float_power",
     "xlogy", "hypot", "logaddexp", "logaddexp2", "polar", "real", "imag", "angle", "conj", "repeat_interleave",
     "tile", "broadcast_to", "masked_select", "index_put", "index_copy", "index_fill", "narrow_copy",
     "select_scatter", "slice_scatter", "diagonal_scatter", "take_along_dim", "quantile", "nanquantile",
     "histogram", "cov", "corrcoef", "vander", "block_diag", "cartesian_prod", "combinations", "rot90",
     "fliplr", "flipud", "movedim", "square", "frexp", "ldexp", "copysign", "nextafter", "signbit", "sgn",
     "deg2rad", "rad2deg", "positive", "negative", "absolute", "subtract", "multiply", "divide", "mvlgamma",
     "polygamma", "i0", "sinc", "logit", "special", "addmm"}
)

