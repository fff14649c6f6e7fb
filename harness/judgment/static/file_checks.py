"""The checks of the whole candidate file: tampering, use of the reference, seeds, threads,
streams, tensor subclasses, precision settings."""

from __future__ import annotations

import ast
from collections.abc import Callable

from kb_mcp.harness.judgment.static.names import Context, qualname, root_name
from kb_mcp.harness.judgment.static.vocabulary import (
    ALLOCATOR_CALLS,
    BUILD_CALLS,
    CHANNEL_CALLS,
    CHANNEL_MODULES,
    CUDA_LIBRARY_CALLS,
    CUDA_STREAM_CALLS,
    FRAME_ATTRS,
    INTROSPECTION,
    LIBRARY_COMPILERS,
    PRECISION_FLAGS,
    PRECISION_SETTERS,
    SEED_NAMES,
    TENSOR_SUBCLASS_HOOKS,
    TENSOR_SUBCLASS_MAKERS,
    THREAD_CALLS,
)
from kb_mcp.harness.judgment.verdict import FindingCode


def _module_call(table: dict[str, frozenset[str]] | dict[str, set[str]], qn: str, last: str) -> bool:
    parts = qn.split(".")
    return len(parts) == 2 and parts[0] in table and last in table[parts[0]]


_L2_CALLS = frozenset({"cuCtxSetLimit", "cudaDeviceSetLimit", "cuStreamSetAttribute", "cudaStreamSetAttribute",
                       "cuCtxResetPersistingL2Cache", "cudaCtxResetPersistingL2Cache"})
_RNG_CALLS = frozenset({"seed", "get_state", "set_state", "getstate", "setstate", "default_rng", "RandomState"})

# Calls that are findings anywhere in the file, first match wins: (test on the qualified name and
# its last part, code, message with {qn} and {call}).
CALL_RULES: tuple[tuple[Callable[[str, str], bool], FindingCode, str], ...] = (
    (lambda qn, last: any(qn == p or qn.startswith(p + ".") for p in LIBRARY_COMPILERS), FindingCode.library_call,
     "`{qn}` generates kernels from PyTorch ops; a candidate's kernels must be its own (load_inline or "
     "torch.cuda._compile_kernel)"),
    (lambda qn, last: qn.startswith("torch.") and last in SEED_NAMES, FindingCode.seed_prediction,
     "`{qn}` reads or sets the random-number state; test inputs come from secret seeds and must not be predicted"),
    (lambda qn, last: qn.startswith(("random.", "numpy.random.")) and last in _RNG_CALLS, FindingCode.seed_prediction,
     "`{qn}` seeds or reads a random-number generator; test inputs come from secret seeds and must not be predicted"),
    (lambda qn, last: qn.startswith("torch.") and last in PRECISION_SETTERS, FindingCode.precision_lowered,
     "`{qn}` changes PyTorch's global numerics, which the reference shares; keep the reference's precision and "
     "compute in your kernel at the problem's dtype"),
    (lambda qn, last: qn.startswith("torch.") and last in {"use_deterministic_algorithms", "set_num_threads"},
     FindingCode.harness_tampering, "`{qn}` changes global PyTorch settings the harness and reference share"),
    (lambda qn, last: qn.startswith("torch.cuda.") and last in CUDA_STREAM_CALLS, FindingCode.unsynchronized_work,
     "`{qn}` runs work on another stream, which the harness's stream timer can miss; launch on the current "
     "stream (torch.cuda.current_stream())"),
    (lambda qn, last: qn.startswith("torch.cuda.") and last in CUDA_LIBRARY_CALLS, FindingCode.library_call,
     "`{qn}` reaches cuBLAS; write the kernel yourself or use the `gemm` allow-list"),
    (lambda qn, last: qn.startswith("torch.cuda.") and last in ALLOCATOR_CALLS, FindingCode.harness_tampering,
     "`{qn}` manipulates the CUDA memory allocator, which the harness uses to poison output buffers; allocate "
     "outputs with torch.empty/empty_like"),
    (lambda qn, last: qn.startswith("torch.") and last in TENSOR_SUBCLASS_MAKERS, FindingCode.wrong_output_type,
     "`{qn}` builds a tensor subclass; ModelNew must return plain torch.Tensor objects computed in forward"),
    (lambda qn, last: _module_call(INTROSPECTION, qn, last), FindingCode.harness_tampering,
     "`{qn}` inspects the interpreter's objects or frames, which reaches the harness's own state (reference "
     "outputs, timers); candidates must not"),
    (lambda qn, last: _module_call(CHANNEL_CALLS, qn, last), FindingCode.forged_result,
     "`{qn}` writes to file descriptors, forks or ends the process; a candidate must not touch the worker's "
     "channels or lifetime"),
    (lambda qn, last: any(qn.startswith(m + ".") and last in names for m, names in THREAD_CALLS.items()),
     FindingCode.background_thread,
     "`{qn}` starts a thread or event loop; work done there can escape the timer. Do the work inside forward "
     "on the current stream"),
    (lambda qn, last: last in _L2_CALLS, FindingCode.l2_persistence,
     "`{call}` changes device limits or stream attributes (the L2 persisting set-aside and access-policy "
     "window); persisting lines survive the harness's L2 flush"),
)


class FileVisitor(ast.NodeVisitor):
    """Checks the whole file: tampering, reference use, seeds, threads, streams, tensor subclasses."""

    def __init__(self, ctx: Context, parents: dict[ast.AST, ast.AST]) -> None:
        self.ctx = ctx
        self.parents = parents

    # -- names
    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id == "Model":
            self.ctx.add(
                FindingCode.reference_fallback,
                node.lineno,
                f"line {node.lineno}: the candidate uses `Model`, the reference implementation; "
                "ModelNew must compute the result itself and must not call, wrap or subclass Model",
            )
        elif isinstance(node.ctx, ast.Load) and node.id in {"get_inputs", "get_init_inputs"}:
            self.ctx.add(
                FindingCode.seed_prediction,
                node.lineno,
                f"line {node.lineno}: the candidate uses the problem's `{node.id}`; test inputs are "
                "secret and must not be generated or predicted by the candidate",
            )
        elif isinstance(node.ctx, (ast.Load, ast.Store)) and node.id == "__builtins__":
            self.ctx.add(
                FindingCode.harness_tampering,
                node.lineno,
                f"line {node.lineno}: the candidate touches `__builtins__`; candidates must not change "
                "the interpreter the harness runs in",
            )
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        names = {a.name for a in node.names}
        if "Model" in names or "get_inputs" in names:
            self.ctx.add(
                FindingCode.reference_fallback,
                node.lineno,
                f"line {node.lineno}: the candidate imports the reference problem's names "
                f"({', '.join(sorted(names & {'Model', 'get_inputs'}))}); ModelNew must stand alone",
            )
        self._check_import(node.lineno, node.module or "", [f"{node.module}.{n}" for n in names])
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self._check_import(node.lineno, "", [a.name for a in node.names])
        self.generic_visit(node)

    def _check_import(self, line: int, module: str, names: list[str]) -> None:
        for full in [module, *names]:
            if not full:
                continue
            top = full.split(".")[0]
            if top == "ctypes":
                self.ctx.add(
                    FindingCode.harness_tampering,
                    line,
                    f"line {line}: the candidate imports ctypes, which gives raw access to process "
                    "memory and driver APIs; launch kernels through load_inline or "
                    "torch.cuda._compile_kernel instead",
                )
                return
            if top in CHANNEL_MODULES or full.startswith("multiprocessing"):
                self.ctx.add(
                    FindingCode.forged_result,
                    line,
                    f"line {line}: the candidate imports `{full}`; processes, sockets and signals can "
                    "reach the harness's result channel. A candidate only computes its output",
                )
                return
            if full.startswith(("unittest.mock", "torch.utils._python_dispatch", "torch.overrides")):
                self.ctx.add(
                    FindingCode.harness_tampering,
                    line,
                    f"line {line}: the candidate imports `{full}`, a tool for intercepting or "
                    "replacing functions; candidates must not change how the harness observes them",
                )
                return

    # -- calls
    def visit_Call(self, node: ast.Call) -> None:
        qn = qualname(node.func, self.ctx.aliases) or ""
        line = node.lineno
        if qn in {"setattr", "delattr"} and node.args:
            target = qualname(node.args[0], self.ctx.aliases) or ""
            if root_name(node.args[0]) in self.ctx.modules or target.startswith("torch"):
                self.ctx.add(
                    FindingCode.harness_tampering,
                    line,
                    f"line {line}: `{qn}` on `{ast.unparse(node.args[0])}` replaces a library "
                    "attribute; the harness's timer, synchronize and comparison functions must stay "
                    "untouched",
                )
        else:
            rule = next((r for r in CALL_RULES if r[0](qn, qn.split(".")[-1])), None)
            if rule is not None:
                self.ctx.add(rule[1], line, f"line {line}: " + rule[2].format(qn=qn, call=ast.unparse(node.func)))
        self.generic_visit(node)

    # -- attributes
    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in FRAME_ATTRS:
            self.ctx.add(
                FindingCode.harness_tampering,
                node.lineno,
                f"line {node.lineno}: `.{node.attr}` walks interpreter frames, which reaches the harness's "
                "own variables; candidates must not",
            )
        qn = qualname(node, self.ctx.aliases) or ""
        outermost = not isinstance(self.parents.get(node), ast.Attribute)
        if outermost and qn.startswith(("torch.utils._python_dispatch.", "torch.overrides.", "torch._C._Disable",
                                        "torch._C._ExcludeDispatchKeyGuard", "torch._C._pop_torch_")):
            self.ctx.add(
                FindingCode.harness_tampering,
                node.lineno,
                f"line {node.lineno}: `{qn}` changes how PyTorch dispatches ops, which hides them from "
                "the harness's op recorder; candidates must not",
            )
        elif qn.startswith("torch._C") and qn.count(".") >= 2 and outermost:
            self.ctx.add(
                FindingCode.harness_tampering,
                node.lineno,
                f"line {node.lineno}: `{qn}` uses private PyTorch internals (dispatch state, allocator, "
                "hooks); use the public API",
            )
        self.generic_visit(node)

    # -- assignments
    def _check_target(self, target: ast.AST, line: int) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._check_target(elt, line)
            return
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return
        root = root_name(target)
        qn = qualname(target, self.ctx.aliases) if isinstance(target, ast.Attribute) else None
        if qn and qn.startswith("torch.backends.") and qn.rsplit(".", 1)[-1] in PRECISION_FLAGS:
            self.ctx.add(
                FindingCode.precision_lowered,
                line,
                f"line {line}: assigning `{qn}` changes matmul/convolution precision for the reference "
                "too; compute at the problem's precision in your own kernel",
            )
            return
        if qn == "torch.backends.cudnn.benchmark":
            self.ctx.add(
                FindingCode.cudnn_benchmark,
                line,
                f"line {line}: assigning `{qn}` autotunes cuDNN's convolutions (the reference's too): a speed-up "
                "of library ops, not of a kernel of your own; leave it as it is",
            )
            return
        if (qn and (qn == "os.environ" or qn.startswith("os.environ."))) or is_environ_item(target, self.ctx):
            return  # build settings such as TORCH_CUDA_ARCH_LIST are the candidate's business
        if root is not None and (root in self.ctx.modules or root in {"__builtins__", "builtins"}):
            self.ctx.add(
                FindingCode.harness_tampering,
                line,
                f"line {line}: assigning to `{ast.unparse(target)}` replaces part of an imported "
                "library; the harness's timers, synchronize and comparison functions must stay untouched",
            )

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_target(t, node.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target, node.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target, node.lineno)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._check_target(t, node.lineno)
        self.generic_visit(node)

    # -- classes
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            qn = qualname(base, self.ctx.aliases) or ""
            if qn in {"torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase"}:
                self.ctx.add(
                    FindingCode.wrong_output_type,
                    node.lineno,
                    f"line {node.lineno}: class `{node.name}` subclasses torch.Tensor; ModelNew must "
                    "return plain tensors whose values exist when forward returns",
                )
            if qn.endswith(("TorchDispatchMode", "TorchFunctionMode")):
                self.ctx.add(
                    FindingCode.harness_tampering,
                    node.lineno,
                    f"line {node.lineno}: class `{node.name}` defines a dispatch/function mode, which "
                    "intercepts the harness's own tensor operations",
                )
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in TENSOR_SUBCLASS_HOOKS:
                self.ctx.add(
                    FindingCode.wrong_output_type,
                    item.lineno,
                    f"line {item.lineno}: `{node.name}.{item.name}` intercepts tensor operations "
                    "(a lazy or forged tensor); return plain torch.Tensor results",
                )
        self.generic_visit(node)

    # -- try/except around the kernel build
    def visit_Try(self, node: ast.Try) -> None:
        builds = [
            n for stmt in node.body for n in ast.walk(stmt)
            if isinstance(n, ast.Call) and (qualname(n.func, self.ctx.aliases) or "").rsplit(".", 1)[-1] in BUILD_CALLS
        ]
        if builds:
            for handler in node.handlers:
                if not any(isinstance(n, ast.Raise) for s in handler.body for n in ast.walk(s)):
                    self.ctx.add(
                        FindingCode.reference_fallback,
                        handler.lineno,
                        f"line {handler.lineno}: the kernel build at line {builds[0].lineno} is wrapped in "
                        "a try/except that does not re-raise, so a failed build silently falls back to "
                        "other code; let build errors propagate",
                    )
        self.generic_visit(node)


def is_environ_item(target: ast.AST, ctx: Context) -> bool:
    return isinstance(target, ast.Subscript) and qualname(target.value, ctx.aliases) == "os.environ"

