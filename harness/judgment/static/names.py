"""What a candidate file's names mean: its imports and aliases, its own built extensions, its
functions and classes, and what `ModelNew.forward` can reach."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from kb_mcp.harness.judgment.verdict import Finding, FindingCode


@dataclass
class Context:
    allow: frozenset[str]
    # Composed mode: PyTorch compute ops on the forward path are judged at runtime against the ops the
    # reference itself runs (`harness.judgment.composed`), which only a run can tell; no static finding here.
    composed: bool = False
    aliases: dict[str, str] = field(default_factory=dict)  # local name -> qualified name
    modules: set[str] = field(default_factory=set)  # local names bound to imported modules/objects
    # The candidate's own built modules and kernels (results of load_inline, load, _compile_kernel):
    # module-level names, functions that return one, and `self.X` attributes holding one.
    extensions: set[str] = field(default_factory=set)
    extension_functions: set[str] = field(default_factory=set)
    extension_attrs: set[str] = field(default_factory=set)
    functions: dict[str, list[ast.AST]] = field(default_factory=dict)  # name -> defs (functions, methods)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def add(self, code: FindingCode, line: int | None, message: str) -> None:
        self.findings.append(Finding(code=code, message=message, source="static", line=line))


def qualname(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`F.softmax` -> `torch.nn.functional.softmax` through the file's imports; None if unknown."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = qualname(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Call):  # torch.cuda.current_stream().synchronize -> keep the callee's name
        base = qualname(node.func, aliases)
        return f"{base}()" if base else None
    return None


def root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def collect_imports(tree: ast.Module, ctx: Context) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    ctx.aliases[a.asname] = a.name
                    ctx.modules.add(a.asname)
                else:
                    top = a.name.split(".")[0]
                    ctx.aliases.setdefault(top, top)
                    ctx.modules.add(top)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                local = a.asname or a.name
                ctx.aliases[local] = f"{node.module}.{a.name}"
                ctx.modules.add(local)
    # Module-level aliases such as `mm = torch.matmul` or `cuda = torch.cuda`.
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
            target = qualname(node.value, ctx.aliases)
            if target and target.split(".")[0] in {ctx.aliases.get(m, m).split(".")[0] for m in ctx.modules}:
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        ctx.aliases[t.id] = target
                        ctx.modules.add(t.id)


EXTENSION_BUILDERS = frozenset({"load_inline", "_compile_kernel", "compile_kernel", "_nvrtc_compile"})


def builds_extension(node: ast.AST | None, ctx: Context) -> bool:
    """True for a call of load_inline / cpp_extension.load / _compile_kernel (the candidate's own build)."""
    if not isinstance(node, ast.Call):
        return False
    qn = qualname(node.func, ctx.aliases) or ""
    last = qn.rsplit(".", 1)[-1]
    return last in EXTENSION_BUILDERS or (last == "load" and qn.startswith("torch.utils.cpp_extension."))


def names_bound(fn: ast.AST) -> set[str]:
    """Parameters and names a function assigns (its locals), without descending into nested scopes."""
    bound: set[str] = set()
    args = getattr(fn, "args", None)
    if isinstance(args, ast.arguments):
        for a in args.posonlyargs + args.args + args.kwonlyargs + [x for x in (args.vararg, args.kwarg) if x]:
            bound.add(a.arg)
    declared_global: set[str] = set()
    todo = list(getattr(fn, "body", []))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            if not isinstance(node, ast.Lambda):
                bound.add(node.name)
            continue
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared_global.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return bound - declared_global


def collect_extensions(tree: ast.Module, ctx: Context) -> None:
    """Finds the names under which the candidate holds its own built modules and kernels."""

    def is_extension(value: ast.AST | None) -> bool:
        if builds_extension(value, ctx):
            return True
        if isinstance(value, ast.Name):
            return value.id in ctx.extensions
        if isinstance(value, ast.Call):
            callee = value.func
            name = callee.id if isinstance(callee,
                                           ast.Name) else callee.attr if isinstance(callee, ast.Attribute) else None
            return name in ctx.extension_functions
        return False

    def assigned(node: ast.AST) -> tuple[list[ast.AST], ast.AST | None]:
        if isinstance(node, ast.Assign):
            return list(node.targets), node.value
        if isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            return [node.target], node.value
        return [], None

    globals_of: dict[int, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            globals_of[id(node)] = {n for g in ast.walk(node) if isinstance(g, ast.Global) for n in g.names}
    # Two passes: a function may return a module-level extension, an attribute may hold a function's result.
    for _ in range(2):
        for stmt in tree.body:
            targets, value = assigned(stmt)
            if is_extension(value):
                ctx.extensions.update(t.id for t in targets if isinstance(t, ast.Name))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            local_ext: set[str] = set()
            for node in ast.walk(fn):
                targets, value = assigned(node)
                if not is_extension(value):
                    continue
                for t in targets:
                    if isinstance(t, ast.Name):
                        (ctx.extensions if t.id in globals_of.get(id(fn), set()) else local_ext).add(t.id)
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        ctx.extension_attrs.add(t.attr)
            for node in ast.walk(fn):
                if isinstance(node, ast.Return) and node.value is not None and (
                    is_extension(node.value) or (isinstance(node.value, ast.Name) and node.value.id in local_ext)
                ):
                    ctx.extension_functions.add(fn.name)


def collect_defs(tree: ast.Module, ctx: Context) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if not isinstance(node, ast.Lambda):
                ctx.functions.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.ClassDef):
            ctx.classes.setdefault(node.name, node)


def is_docstring(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    if not isinstance(parent, ast.Expr):
        return False
    holder = parents.get(parent)
    if not isinstance(holder, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    return bool(holder.body) and holder.body[0] is parent


def reachable_from_forward(ctx: Context) -> list[ast.AST]:
    """ModelNew.forward plus every function, method or class of this file it can reach by name."""
    model = ctx.classes.get("ModelNew")
    if model is None:
        return []
    methods = {n.name: n for n in model.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    start = methods.get("forward") or methods.get("__call__")
    if start is None:
        return []
    seen: set[int] = set()
    order: list[ast.AST] = []
    todo: list[ast.AST] = [start]
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        order.append(fn)
        for node in ast.walk(fn):
            name: str | None = None
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                name = node.id
            elif isinstance(node, ast.Attribute):
                name = node.attr
            if name is None:
                continue
            for target in ctx.functions.get(name, ()):
                todo.append(target)
            cls = ctx.classes.get(name)
            if cls is not None and cls is not model:
                todo.extend(n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return order


def nn_module_attrs(model: ast.ClassDef, ctx: Context) -> dict[str, str]:
    """`self.fc = nn.Linear(...)` in ModelNew -> {'fc': 'Linear'} (PyTorch layers held by the model)."""
    found: dict[str, str] = {}
    for node in ast.walk(model):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        callee = qualname(node.value.func, ctx.aliases) or ""
        if not callee.startswith("torch.nn.") or callee.startswith("torch.nn.functional."):
            continue
        layer = callee.rsplit(".", 1)[-1]
        if layer in {"Parameter", "ParameterList", "ParameterDict", "Module", "ModuleList", "ModuleDict",
                     "Identity", "Buffer", "Sequential"} or not layer[:1].isupper():
            continue
        for t in node.targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                found[t.attr] = layer
    return found


def layer_op(layer: str) -> str:
    """`Linear` -> `linear`, `Conv2d` -> `conv2d`, `LayerNorm` -> `layer_norm` (for the allow-list)."""
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", layer).lower()

