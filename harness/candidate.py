"""Candidates: `class ModelNew` (same constructor as the problem's `Model`) plus the CUDA it builds.

Two styles are understood:

* `load_inline` (KernelBench-compatible): `torch.utils.cpp_extension.load_inline(name, cpp_sources,
  cuda_sources, functions=[...])`, usually at module level.
* NVRTC: `torch.cuda._compile_kernel(kernel_source, kernel_name)` returns a kernel launched as
  `k(grid=(gx, gy, gz), block=(bx, by, bz), args=[tensors, ints, floats], shared_mem=bytes)`.

This module reads a candidate without running it (server side, no torch): it checks the file is
Python that defines `ModelNew`, and finds the CUDA source strings passed to those builders where
they are literals or module-level string constants. The worker finds the rest by running the
module with the builders intercepted (`harness.compile.capture_units`).
"""

from __future__ import annotations

import ast
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NVRTC_BUILDERS = frozenset({"_compile_kernel", "compile_kernel"})
INLINE_BUILDERS = frozenset({"load_inline"})

# Positional parameters of the builders, in order (torch 2.11 signatures).
_NVRTC_PARAMS = ("kernel_source", "kernel_name", "compute_capability", "cuda_include_dirs", "nvcc_options")
_INLINE_PARAMS = (
    "name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
    "extra_ldflags", "extra_include_paths",
)
_INLINE_FLAGS = {  # keyword -> (SourceUnit field, whether the field is the keyword negated)
    "with_cuda": ("with_cuda", False),
    "is_python_module": ("python_module", False),
    "no_implicit_headers": ("implicit_headers", True),
    "with_pytorch_error_handling": ("error_handling", False),
}


class CandidateError(ValueError):
    """A candidate that cannot be a candidate: not Python, or no `ModelNew`; the message says which."""


class SourceUnit(BaseModel):
    """The arguments of one builder call: what would be compiled, and how."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["nvrtc", "load_inline"]
    name: str  # kernel name (NVRTC) or extension name (load_inline)
    cuda_source: str = ""
    cpp_source: str = ""  # load_inline only
    functions: list[str] = Field(default_factory=list)  # load_inline: functions to bind
    nvcc_options: list[str] = Field(default_factory=list)  # NVRTC options or extra_cuda_cflags
    cflags: list[str] = Field(default_factory=list)  # load_inline extra_cflags
    include_dirs: list[str] = Field(default_factory=list)
    ldflags: list[str] = Field(default_factory=list)  # load_inline extra_ldflags
    with_cuda: bool | None = None  # load_inline: None = when there is CUDA source
    python_module: bool = True  # load_inline is_python_module (False: a plain library loaded into torch.ops)
    implicit_headers: bool = True  # load_inline prepends torch/extension.h (False: no_implicit_headers=True)
    error_handling: bool = True  # load_inline with_pytorch_error_handling
    line: int | None = None  # where the call is, when found statically

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What makes two units the same build."""
        return (self.kind, self.name, self.cuda_source, self.cpp_source)


_GLOBAL = re.compile(r"__global__")
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")
_KERNEL_DECL = re.compile(r"__global__\s+([^;{}()]*?)\b([A-Za-z_]\w*)\s*\(")
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def kernel_names(cuda_source: str) -> list[str]:
    """Names of the `__global__` functions a CUDA source defines or declares, in order, unique."""
    text = _LAUNCH_BOUNDS.sub(" ", _COMMENTS.sub(" ", cuda_source))
    names: list[str] = []
    for m in _KERNEL_DECL.finditer(text):
        name = m.group(2)
        if name not in names and name not in ("void", "__global__"):
            names.append(name)
    return names


def parse_candidate(source: str, where: str = "<candidate>") -> ast.Module:
    """The candidate's syntax tree; raises CandidateError when it does not parse or lacks ModelNew."""
    if not source.strip():
        raise CandidateError(f"{where}: the candidate source is empty")
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError as exc:
        raise CandidateError(f"{where}: Python syntax error at line {exc.lineno}: {exc.msg}") from exc
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body) and not any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ModelNew" for t in n.targets)
        for n in tree.body
    ):
        raise CandidateError(
            f"{where}: no top-level `class ModelNew` (a candidate defines ModelNew(nn.Module) with the same "
            "constructor arguments as the problem's Model)"
        )
    return tree


class _Resolver:
    """Evaluates the string-valued expressions a builder call is made with, where that is static."""

    def __init__(self, tree: ast.Module) -> None:
        self.names: dict[str, ast.expr] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.names[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.names[node.target.id] = node.value

    def value(self, node: ast.expr | None, depth: int = 0) -> Any:
        """The constant value of `node` (str, list of str, number) or None when not static."""
        if node is None or depth > 20:
            return None
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            target = self.names.get(node.id)
            return self.value(target, depth + 1) if target is not None else None
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self.value(e, depth + 1) for e in node.elts]
            return None if any(i is None for i in items) else list(items)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.value(node.left, depth + 1), self.value(node.right, depth + 1)
            if isinstance(left, str) and isinstance(right, str):
                return left + right
            if isinstance(left, list) and isinstance(right, list):
                return left + right
        if isinstance(node, ast.JoinedStr):
            parts = [self.value(v.value if isinstance(v, ast.FormattedValue) else v, depth + 1) for v in node.values]
            if all(isinstance(p, (str, int, float)) for p in parts):
                return "".join(str(p) for p in parts)
        return None


def _callee(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def _joined(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return ""


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [str(v) for v in value]
    return []


def static_units(source: str) -> list[SourceUnit]:
    """Builder calls whose CUDA source can be read without running the candidate."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    resolver = _Resolver(tree)
    units: list[SourceUnit] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _callee(node)
        if name in NVRTC_BUILDERS:
            args = dict(zip(_NVRTC_PARAMS, node.args))
            args.update({k.arg: k.value for k in node.keywords if k.arg})
            src = resolver.value(args.get("kernel_source"))
            kname = resolver.value(args.get("kernel_name"))
            if isinstance(src, str) and src.strip():
                units.append(
                    SourceUnit(
                        kind="nvrtc",
                        name=kname if isinstance(kname, str) else (kernel_names(src) or ["kernel"])[0],
                        cuda_source=src,
                        nvcc_options=_strings(resolver.value(args.get("nvcc_options"))),
                        include_dirs=_strings(resolver.value(args.get("cuda_include_dirs"))),
                        line=node.lineno,
                    )
                )
        elif name in INLINE_BUILDERS:
            args = dict(zip(_INLINE_PARAMS, node.args))
            args.update({k.arg: k.value for k in node.keywords if k.arg})
            cuda = resolver.value(args.get("cuda_sources"))
            cpp = resolver.value(args.get("cpp_sources"))
            if cuda is None and cpp is None:
                continue
            ext = resolver.value(args.get("name"))
            switches: dict[str, Any] = {}
            for keyword, (fld, negated) in _INLINE_FLAGS.items():
                value = resolver.value(args.get(keyword))
                if isinstance(value, bool):
                    switches[fld] = (not value) if negated else value
            units.append(
                SourceUnit(
                    kind="load_inline",
                    name=ext if isinstance(ext, str) else "extension",
                    cuda_source=_joined(cuda),
                    cpp_source=_joined(cpp),
                    functions=_strings(resolver.value(args.get("functions"))),
                    nvcc_options=_strings(resolver.value(args.get("extra_cuda_cflags"))),
                    cflags=_strings(resolver.value(args.get("extra_cflags"))),
                    include_dirs=_strings(resolver.value(args.get("extra_include_paths"))),
                    ldflags=_strings(resolver.value(args.get("extra_ldflags"))),
                    line=node.lineno,
                    **switches,
                )
            )
    return units


def style_of(units: list[SourceUnit]) -> Literal["nvrtc", "load_inline", "mixed", "none"]:
    """The candidate's style from the units it builds."""
    kinds = {u.kind for u in units}
    if not kinds:
        return "none"
    if len(kinds) > 1:
        return "mixed"
    return "nvrtc" if "nvrtc" in kinds else "load_inline"
