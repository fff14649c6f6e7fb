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

from kb_mcp.kb import pyparse

NVRTC_BUILDERS = frozenset({"_compile_kernel", "compile_kernel"})
INLINE_BUILDERS = frozenset({"load_inline"})

# Positional parameters of the builders, in order (torch 2.11 to 2.14 signatures).
_NVRTC_PARAMS = ("kernel_source", "kernel_name", "compute_capability", "cuda_include_dirs", "nvcc_options")
_INLINE_PARAMS = (
    "name", "cpp_sources", "cuda_sources", "sycl_sources", "functions", "extra_cflags", "extra_cuda_cflags",
    "extra_sycl_cflags", "extra_ldflags", "extra_include_paths",
)
# load_inline's other parameters: none of them changes what is built or its name.
_INLINE_OTHERS = frozenset({"build_directory", "verbose", "with_sycl", "keep_intermediates", "use_pch"})
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


def inline_unit(arguments: dict[str, Any], line: int | None = None) -> SourceUnit:
    """The SourceUnit of one `load_inline` call from its arguments by parameter name (missing ones
    take load_inline's defaults). The one reading of a call: the worker's builder reads the call it
    intercepts with it, and a build ahead reads the statically known calls with it
    (`inline_units_ahead`), so both name the build alike (`toolchain.extension_name`)."""

    def joined(v: Any) -> str:
        if v is None:
            return ""
        return v if isinstance(v, str) else "\n".join(str(x) for x in v)

    def listed(v: Any) -> list[str]:
        if v is None:
            return []
        return [v] if isinstance(v, str) else [str(x) for x in v]

    a = arguments
    functions = a.get("functions")
    if isinstance(functions, dict):
        functions = list(functions)
    return SourceUnit(
        kind="load_inline",
        name=str(a.get("name") or "extension"),
        cuda_source=joined(a.get("cuda_sources")),
        cpp_source=joined(a.get("cpp_sources")),
        functions=listed(functions),
        nvcc_options=listed(a.get("extra_cuda_cflags")),
        cflags=listed(a.get("extra_cflags")),
        include_dirs=listed(a.get("extra_include_paths")),
        ldflags=listed(a.get("extra_ldflags")),
        with_cuda=a.get("with_cuda"),
        python_module=bool(a.get("is_python_module", True)),
        implicit_headers=not bool(a.get("no_implicit_headers", False)),
        error_handling=bool(a.get("with_pytorch_error_handling", True)),
        line=line,
    )


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
        tree = pyparse.parse(source, where)
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
        tree = pyparse.parse(source)
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


# ---------------------------------------------------------------------------------------------
# What a build ahead may build: calls whose arguments are certain from the syntax tree

_UNKNOWN: Any = object()  # a value the syntax tree does not make certain
_TEXT = ("name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags", "extra_ldflags",
         "extra_include_paths")
_SWITCHES = ("is_python_module", "no_implicit_headers", "with_pytorch_error_handling")


class _Certain:
    """Values of expressions that hold whatever runs before the call: literals, names bound exactly
    once in the whole module (at its top level, never rebound, augmented, declared global, a
    parameter or a loop variable anywhere, and for lists never touched through a method or an
    index), `+` of two such, and f-strings of such without a format; `_UNKNOWN` otherwise."""

    def __init__(self, tree: ast.Module) -> None:
        bindings: dict[str, int] = {}
        touched: set[str] = set()
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                names = [node.id]
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                names = list(node.names) * 2
            elif isinstance(node, ast.arg):
                names = [node.arg]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.alias):
                names = [(node.asname or node.name).split(".")[0]]
            elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.value, ast.Name):
                touched.add(node.value.id)
            for name in names:
                bindings[name] = bindings.get(name, 0) + 1
        self.names: dict[str, ast.expr] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target, value = node.targets[0].id, node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                target, value = node.target.id, node.value
            else:
                continue
            if bindings.get(target) == 1:
                self.names[target] = value
        self.touched = touched  # names used through `.attr` or `[i]`: a list there may have been changed

    def value(self, node: ast.expr, depth: int = 0) -> Any:
        """The value `node` certainly has (str, bool, number, None, or a list of such), or `_UNKNOWN`."""
        if depth > 20:
            return _UNKNOWN
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bool, int, float, type(None))):
            return node.value
        if isinstance(node, ast.Name):
            target = self.names.get(node.id)
            value = _UNKNOWN if target is None else self.value(target, depth + 1)
            return _UNKNOWN if isinstance(value, list) and node.id in self.touched else value
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self.value(e, depth + 1) for e in node.elts]
            return _UNKNOWN if any(i is _UNKNOWN for i in items) else list(items)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.value(node.left, depth + 1), self.value(node.right, depth + 1)
            same = (isinstance(left, str) and isinstance(right, str)) or (isinstance(left, list) and
                                                                          isinstance(right, list))
            return left + right if same else _UNKNOWN
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.FormattedValue) and (v.conversion != -1 or v.format_spec is not None):
                    return _UNKNOWN
                part = self.value(v.value if isinstance(v, ast.FormattedValue) else v, depth + 1)
                if not isinstance(part, (str, int, float)) or isinstance(part, bool):
                    return _UNKNOWN
                parts.append(str(part))
            return "".join(parts)
        return _UNKNOWN


def _fits(param: str, value: Any) -> bool:
    """Whether the worker reads `value` for `param` as the same field as `inline_unit` here does."""
    if param == "name":
        return isinstance(value, str) and bool(value)
    if param in _TEXT:
        return value is None or isinstance(value, str) or (isinstance(value, list) and
                                                           all(isinstance(v, str) for v in value))
    if param == "with_cuda":
        return value is None or isinstance(value, bool)
    if param in _SWITCHES:
        return isinstance(value, bool)
    return param in ("sycl_sources", "extra_sycl_cflags") and value is None


def inline_units_ahead(source: str) -> list[SourceUnit]:
    """The `load_inline` calls a build ahead may build: those whose every argument that goes into
    the build is certain from the syntax tree (`_Certain`), read by `inline_unit` as the worker reads
    the call it intercepts, so an extension built ahead carries the very name the worker will look
    up. A call with anything computed at run time, `*args`/`**kwargs` or an unknown parameter is
    left out: the worker builds it on demand, as always. (A call that never runs costs a build,
    never a verdict: the worker names and looks up every build itself.)"""
    try:
        tree = pyparse.parse(source)
    except SyntaxError:
        return []
    certain = _Certain(tree)
    units: list[SourceUnit] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _callee(node) not in INLINE_BUILDERS:
            continue
        if len(node.args) > len(_INLINE_PARAMS) or any(isinstance(a, ast.Starred) for a in node.args):
            continue
        given = dict(zip(_INLINE_PARAMS, node.args))
        if any(k.arg is None or k.arg in given for k in node.keywords):
            continue  # **kwargs, or a parameter given twice (a TypeError when it runs)
        given.update({k.arg: k.value for k in node.keywords if k.arg})
        if "name" not in given or "cpp_sources" not in given:
            continue
        values = {p: certain.value(e) for p, e in given.items() if p not in _INLINE_OTHERS}
        if all(v is not _UNKNOWN and _fits(p, v) for p, v in values.items()):
            unit = inline_unit(values, line=node.lineno)
            if unit not in units:
                units.append(unit)
    return units
