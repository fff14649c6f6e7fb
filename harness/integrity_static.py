"""Static integrity checks on candidate source: evidence with line numbers, from the syntax tree.

Plain Python (no torch import), so the server can run them before a worker is involved. Names are
resolved through the file's own imports and aliases (`import torch.nn.functional as F`,
`mm = torch.matmul`), comments and docstrings are never read as code, and a statement such as
`pass` or a re-raising `except` is never a finding by itself. C++/CUDA source held in string
constants is scanned with comments stripped.

These checks are evidence, not the whole defence: a determined candidate can hide a call from any
parser (`getattr(torch, "mat" + "mul")`), which is why the runtime guards in
`harness.integrity_runtime` watch what actually executes. Every finding here names the line and
says what to change.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from kb_mcp.harness.verdict import Finding, FindingCode

# ---------------------------------------------------------------------------------------------
# Vocabulary

# PyTorch compute ops by short name; the same names serve `torch.X`, `F.X`, `tensor.X()`,
# `aten::X` (runtime) and `at::X` / `torch::X` in C++ source.
COMPUTE_OPS: frozenset[str] = frozenset(
    """
    matmul mm bmm addmm addbmm baddbmm addmv mv dot vdot einsum tensordot linear bilinear
    _addmm_activation outer ger inner kron chain_matmul
    conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d convolution _convolution
    cudnn_convolution conv_tbc unfold fold
    softmax log_softmax _softmax _log_softmax softmin gumbel_softmax
    layer_norm native_layer_norm group_norm native_group_norm batch_norm native_batch_norm
    instance_norm rms_norm local_response_norm normalize
    relu relu_ relu6 gelu gelu_ silu silu_ sigmoid sigmoid_ tanh tanh_ elu elu_ selu celu leaky_relu
    leaky_relu_ hardtanh hardswish hardsigmoid mish softplus softsign logsigmoid glu prelu rrelu
    threshold tanhshrink softshrink hardshrink
    exp exp_ exp2 expm1 log log_ log2 log10 log1p sqrt sqrt_ rsqrt rsqrt_ pow pow_ square reciprocal
    sin cos tan asin acos atan atan2 sinh cosh erf erfc erfinv lgamma digamma
    sum nansum mean nanmean var std var_mean std_mean norm prod cumsum cumprod logsumexp amax amin
    argmax argmin aminmax topk kthvalue median mode
    mul mul_ div div_ sub sub_ add_ addcmul addcdiv lerp clamp clamp_ clip clip_ maximum minimum
    fmax fmin abs abs_ neg neg_ sign floor ceil round trunc frac fmod remainder where masked_fill
    scatter scatter_add index_add gather index_select take
    max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d
    adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool2d max_pool2d_with_indices
    interpolate upsample grid_sample pad dropout scaled_dot_product_attention
    _scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention
    multi_head_attention_forward embedding embedding_bag one_hot cross_entropy nll_loss mse_loss
    l1_loss smooth_l1_loss huber_loss kl_div binary_cross_entropy cosine_similarity pairwise_distance
    cdist triu tril flip roll sort argsort cross
    """.split()
)

# Groups an allow-list may name; each also allows the matching library's kernels at runtime.
ALLOW_GROUPS: dict[str, frozenset[str]] = {
    "gemm": frozenset(
        "matmul mm bmm addmm addbmm baddbmm addmv mv dot vdot einsum tensordot linear bilinear "
        "_addmm_activation outer inner chain_matmul cublas".split()
    ),
    "conv": frozenset(
        "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d convolution "
        "_convolution cudnn_convolution conv_tbc cudnn".split()
    ),
}

# `torch.X(...)` calls that allocate, describe or launch rather than compute.
TORCH_ALLOWED_CALLS: frozenset[str] = frozenset(
    """
    empty empty_like empty_strided zeros zeros_like ones ones_like full full_like tensor as_tensor
    Size device dtype is_tensor numel is_floating_point is_complex result_type promote_types
    get_default_dtype no_grad inference_mode enable_grad set_grad_enabled is_grad_enabled
    """.split()
)

# `torch.cuda.X(...)` calls that change how work is scheduled (side streams) or reach libraries.
CUDA_STREAM_CALLS = frozenset({"Stream", "stream", "ExternalStream", "set_stream", "StreamContext"})
CUDA_LIBRARY_CALLS = frozenset({"current_blas_handle"})
ALLOCATOR_CALLS = frozenset(
    {"empty_cache", "caching_allocator_alloc", "caching_allocator_delete", "change_current_allocator",
     "CUDAPluggableAllocator", "_set_allocator_settings", "set_per_process_memory_fraction", "MemPool",
     "use_mem_pool"}
)

SEED_NAMES = frozenset(
    {"manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
     "set_rng_state", "get_rng_state_all", "set_rng_state_all", "Generator", "default_generator",
     "fork_rng"}
)

PRECISION_SETTERS = frozenset(
    {"set_float32_matmul_precision", "set_default_dtype", "set_default_tensor_type", "set_flush_denormal"}
)
PRECISION_FLAGS = frozenset(
    {"allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction",
     "fp32_precision", "allow_fp16_accumulation"}
)

# Python modules whose use says the candidate is reaching into the harness's process.
INTROSPECTION = {
    "gc": frozenset({"get_objects", "get_referrers", "get_referents"}),
    "inspect": frozenset({"stack", "currentframe", "getouterframes", "getinnerframes", "trace"}),
    "sys": frozenset({"_getframe", "settrace", "setprofile", "_current_frames", "addaudithook"}),
    "threading": frozenset({"settrace", "setprofile", "settrace_all_threads", "setprofile_all_threads"}),
}
FRAME_ATTRS = frozenset({"f_back", "f_globals", "f_locals", "tb_frame", "gi_frame", "cr_frame", "f_builtins"})
CHANNEL_CALLS = {
    "os": frozenset({"write", "writev", "dup", "dup2", "fork", "forkpty", "kill", "killpg", "_exit",
                     "fdopen", "pipe", "openpty", "system", "execv", "execve", "execvp", "spawnv",
                     "posix_spawn"}),
    "sys": frozenset({"exit"}),
}
CHANNEL_MODULES = frozenset({"socket", "multiprocessing", "subprocess", "signal", "pty", "mmap", "_posixsubprocess"})
THREAD_CALLS = {
    "threading": frozenset({"Thread", "Timer"}),
    "_thread": frozenset({"start_new_thread", "start_new", "start_joinable_thread"}),
    "concurrent.futures": frozenset({"ThreadPoolExecutor", "ProcessPoolExecutor"}),
    "asyncio": frozenset({"new_event_loop", "run", "get_event_loop", "to_thread"}),
}
LIBRARY_COMPILERS = ("torch.compile", "torch.jit", "torch._dynamo", "torch._inductor", "torch.fx")
TENSOR_SUBCLASS_HOOKS = frozenset({"__torch_function__", "__torch_dispatch__"})
TENSOR_SUBCLASS_MAKERS = frozenset({"_make_subclass", "_make_wrapper_subclass", "as_subclass"})
BUILD_CALLS = frozenset({"load_inline", "load", "_compile_kernel", "compile_kernel", "_nvrtc_compile"})
LOGGING_CALLS = frozenset({"print", "warn", "debug", "info", "warning", "error", "exception", "log"})

# Attribute calls on a tensor that are PyTorch compute ops. Names that ordinary Python objects also
# have (`set.add`, `list.sort`, `dict.update`, `str.index`) are left out: static checks must not cry
# wolf, and the runtime guard sees every tensor op anyway.
TENSOR_METHODS: frozenset[str] = frozenset(
    """
    matmul mm bmm addmm addbmm baddbmm addmv mv softmax log_softmax relu relu_ sigmoid sigmoid_ tanh
    tanh_ exp exp_ log_ sqrt sqrt_ rsqrt rsqrt_ pow pow_ reciprocal erf sum nansum mean var std amax
    amin argmax argmin max min cumsum cumprod logsumexp norm clamp clamp_ clamp_min clamp_max mul mul_
    div div_ sub sub_ add_ addcmul addcdiv abs abs_ neg neg_ masked_fill masked_fill_ layer_norm
    """.split()
)


# ---------------------------------------------------------------------------------------------
# Allow-list


def expand_allow(allow: Iterable[str]) -> frozenset[str]:
    """Normalises an allow-list to short op names.

    Entries may be group names (`gemm`, `conv`), Python names (`torch.matmul`,
    `torch.nn.functional.linear`), ATen names (`aten::mm`, `aten.addmm.default`) or short names;
    `torch.matmul` and `aten::matmul` both become `matmul`, so one entry covers the static check
    and the runtime guard alike.
    """
    out: set[str] = set()
    for raw in allow:
        entry = raw.strip()
        if not entry:
            continue
        if entry.lower() in ALLOW_GROUPS:
            out |= ALLOW_GROUPS[entry.lower()]
            continue
        entry = entry.replace("::", ".")
        parts = [p for p in entry.split(".") if p]
        if parts and parts[0] == "aten" and len(parts) >= 2:
            out.add(parts[1])
        elif parts:
            out.add(parts[-1])
    return frozenset(out)


# ---------------------------------------------------------------------------------------------
# C++ / CUDA source held in strings

_CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_CPP_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
_CPP_HINTS = ("__global__", "#include", "__device__", "torch::Tensor", "at::Tensor", "extern \"C\"",
              "PYBIND11_MODULE", "TORCH_LIBRARY", "blockIdx", "threadIdx")


@dataclass(frozen=True)
class _CppRule:
    code: FindingCode
    pattern: re.Pattern[str]
    message: str
    allow_key: str | None = None  # an allow-list entry that lifts the rule


_CPP_RULES: tuple[_CppRule, ...] = (
    _CppRule(
        FindingCode.library_call,
        re.compile(r"#\s*include\s*[<\"](cublas\w*|cublasLt\w*)(\.h)?[>\"]|\bcublas\w*\s*\(|\bgetCurrentCUDABlas(Lt)?Handle\b"),
        "C++ source uses cuBLAS ({match}); write the matrix product as your own kernel, or ask for "
        "the `gemm` allow-list",
        "cublas",
    ),
    _CppRule(
        FindingCode.library_call,
        re.compile(r"#\s*include\s*[<\"]cudnn\w*(\.h)?[>\"]|\bcudnn\w*\s*\(|\bgetCudnnHandle\b"),
        "C++ source uses cuDNN ({match}); write the convolution as your own kernel, or ask for the "
        "`conv` allow-list",
        "cudnn",
    ),
    _CppRule(
        FindingCode.l2_persistence,
        re.compile(
            r"\b(cudaLimitPersistingL2CacheSize|CU_LIMIT_PERSISTING_L2_CACHE_SIZE|accessPolicyWindow|"
            r"cudaAccessPropertyPersisting|CU_ACCESS_PROPERTY_PERSISTING|cudaStreamAttributeAccessPolicyWindow|"
            r"cudaLaunchAttributeAccessPolicyWindow|CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW|"
            r"cudaStreamSetAttribute|cuStreamSetAttribute|cudaCtxResetPersistingL2Cache)\b"
        ),
        "C++ source configures L2 persistence ({match}); persisting lines survive the harness's L2 "
        "flush and make timings unrepresentative: remove it",
    ),
    _CppRule(
        FindingCode.unsynchronized_work,
        re.compile(r"\b(cudaStreamCreate\w*|cuStreamCreate\w*|cudaLaunchHostFunc|cudaStreamAddCallback)\b"),
        "C++ source creates a stream or host callback ({match}); work there can escape the "
        "harness's stream timer: launch on the current stream (at::cuda::getCurrentCUDAStream())",
    ),
    _CppRule(
        FindingCode.background_thread,
        re.compile(r"\b(std::thread|std::async|pthread_create|std::jthread)\b"),
        "C++ source starts a thread ({match}); host threads can hide work from the timer: do the "
        "work inside the call",
    ),
)

_CPP_OPS = "|".join(sorted((re.escape(op) for op in COMPUTE_OPS), key=len, reverse=True))
_CPP_TORCH_OP = re.compile(rf"\b(?:at|torch)::(?:native::|nn::functional::)?({_CPP_OPS})\s*\(")
_CPP_TENSOR_METHOD = re.compile(rf"[\w\)\]]\s*(?:\.|->)\s*({_CPP_OPS})\s*\(")


def _looks_like_cpp(text: str) -> bool:
    return any(hint in text for hint in _CPP_HINTS)


def _strip_cpp_comments(text: str) -> str:
    """Replaces C/C++ comments by blanks of the same line structure, so offsets map to lines."""

    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    # String literals go first so that `"http://x"` is not taken for a comment.
    out: list[str] = []
    pos = 0
    for m in re.finditer(r'"(?:\\.|[^"\\\n])*"|//[^\n]*|/\*.*?\*/', text, re.S):
        out.append(text[pos : m.start()])
        out.append(m.group(0) if m.group(0).startswith('"') else blank(m))
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# The checker


@dataclass
class _Context:
    allow: frozenset[str]
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


def _qualname(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`F.softmax` -> `torch.nn.functional.softmax` through the file's imports; None if unknown."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _qualname(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Call):  # torch.cuda.current_stream().synchronize -> keep the callee's name
        base = _qualname(node.func, aliases)
        return f"{base}()" if base else None
    return None


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _collect_imports(tree: ast.Module, ctx: _Context) -> None:
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
            target = _qualname(node.value, ctx.aliases)
            if target and target.split(".")[0] in {ctx.aliases.get(m, m).split(".")[0] for m in ctx.modules}:
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        ctx.aliases[t.id] = target
                        ctx.modules.add(t.id)


_EXTENSION_BUILDERS = frozenset({"load_inline", "_compile_kernel", "compile_kernel", "_nvrtc_compile"})


def _builds_extension(node: ast.AST | None, ctx: _Context) -> bool:
    """True for a call of load_inline / cpp_extension.load / _compile_kernel (the candidate's own build)."""
    if not isinstance(node, ast.Call):
        return False
    qn = _qualname(node.func, ctx.aliases) or ""
    last = qn.rsplit(".", 1)[-1]
    return last in _EXTENSION_BUILDERS or (last == "load" and qn.startswith("torch.utils.cpp_extension."))


def _names_bound(fn: ast.AST) -> set[str]:
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


def _collect_extensions(tree: ast.Module, ctx: _Context) -> None:
    """Finds the names under which the candidate holds its own built modules and kernels."""

    def is_extension(value: ast.AST | None) -> bool:
        if _builds_extension(value, ctx):
            return True
        if isinstance(value, ast.Name):
            return value.id in ctx.extensions
        if isinstance(value, ast.Call):
            callee = value.func
            name = callee.id if isinstance(callee, ast.Name) else callee.attr if isinstance(callee, ast.Attribute) else None
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


def _collect_defs(tree: ast.Module, ctx: _Context) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if not isinstance(node, ast.Lambda):
                ctx.functions.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.ClassDef):
            ctx.classes.setdefault(node.name, node)


def _is_docstring(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    if not isinstance(parent, ast.Expr):
        return False
    holder = parents.get(parent)
    body = getattr(holder, "body", None)
    return bool(body) and body[0] is parent and isinstance(
        holder, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    )


def _reachable_from_forward(ctx: _Context) -> list[ast.AST]:
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


def _nn_module_attrs(model: ast.ClassDef, ctx: _Context) -> dict[str, str]:
    """`self.fc = nn.Linear(...)` in ModelNew -> {'fc': 'Linear'} (PyTorch layers held by the model)."""
    found: dict[str, str] = {}
    for node in ast.walk(model):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        callee = _qualname(node.value.func, ctx.aliases) or ""
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


def _layer_op(layer: str) -> str:
    """`Linear` -> `linear`, `Conv2d` -> `conv2d`, `LayerNorm` -> `layer_norm` (for the allow-list)."""
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", layer).lower()


class _ForwardVisitor(ast.NodeVisitor):
    """Checks code reachable from ModelNew.forward: library calls and try/except fallbacks."""

    def __init__(self, ctx: _Context, nn_attrs: dict[str, str]) -> None:
        self.ctx = ctx
        self.nn_attrs = nn_attrs
        self.locals: set[str] = set()  # names the function being visited binds itself

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer = self.locals
        self.locals = _names_bound(node)
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
        if op in self.ctx.allow:
            return
        self.ctx.add(
            FindingCode.library_call,
            line,
            f"line {line}: the forward path calls {what}, a PyTorch compute op, not a kernel of your "
            f"own; compute it in your kernel (allocation, views and launches are fine), or run with an "
            f"allow-list that permits `{op}`",
        )

    def visit_Call(self, node: ast.Call) -> None:
        qn = _qualname(node.func, self.ctx.aliases) or ""
        func = node.func
        if qn.startswith("torch.nn.functional."):
            self._library(node.lineno, f"`{qn}`", qn.rsplit(".", 1)[-1])
        elif qn.startswith(("torch.ops.aten.", "torch._C._nn.", "torch._C._VariableFunctions.")):
            self._library(node.lineno, f"`{qn}`", qn.split(".")[3] if qn.count(".") >= 3 else qn)
        elif qn.startswith("torch.special.") or qn.startswith("torch.linalg.") or qn.startswith("torch.fft."):
            self._library(node.lineno, f"`{qn}`", qn.rsplit(".", 1)[-1])
        elif qn.startswith("torch.") and qn.count(".") == 1:
            name = qn.split(".")[1]
            if name not in TORCH_ALLOWED_CALLS and (name in COMPUTE_OPS or name in _TORCH_OP_GUESS):
                self._library(node.lineno, f"`{qn}`", name)
        if isinstance(func, ast.Call):  # `nn.ReLU()(x)`: a layer built and called on the spot
            inner = _qualname(func.func, self.ctx.aliases) or ""
            if inner.startswith("torch.nn.") and inner.rsplit(".", 1)[-1][:1].isupper():
                layer = inner.rsplit(".", 1)[-1]
                self._library(node.lineno, f"the PyTorch layer `nn.{layer}`", _layer_op(layer))
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
            and func.attr in self.nn_attrs
        ):
            layer = self.nn_attrs[func.attr]
            self._library(node.lineno, f"`self.{func.attr}`, a PyTorch `nn.{layer}` layer", _layer_op(layer))
        elif (
            isinstance(func, ast.Attribute)
            and func.attr in TENSOR_METHODS
            and not (_qualname(func.value, self.ctx.aliases) or "").startswith("torch")
            and _root_name(func.value) not in self.ctx.modules
            and not self._own_extension(func.value)  # `_ext.relu(x)`: a function of its own extension
        ):
            self._library(node.lineno, f"the tensor method `.{func.attr}()`", func.attr)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self._library(node.lineno, "the `@` operator (torch.matmul)", "matmul")
        self.generic_visit(node)

    def _check_try(self, node: ast.Try | ast.TryStar) -> None:
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

    def visit_TryStar(self, node: ast.TryStar) -> None:  # pragma: no cover - 3.11+ syntax
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


class _FileVisitor(ast.NodeVisitor):
    """Checks the whole file: tampering, reference use, seeds, threads, streams, tensor subclasses."""

    def __init__(self, ctx: _Context, parents: dict[ast.AST, ast.AST]) -> None:
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
        qn = _qualname(node.func, self.ctx.aliases) or ""
        parts = qn.split(".")
        last = parts[-1] if parts else ""
        line = node.lineno
        if qn in {"setattr", "delattr"} and node.args:
            target = _qualname(node.args[0], self.ctx.aliases) or ""
            if _root_name(node.args[0]) in self.ctx.modules or target.startswith("torch"):
                self.ctx.add(
                    FindingCode.harness_tampering,
                    line,
                    f"line {line}: `{qn}` on `{ast.unparse(node.args[0])}` replaces a library "
                    "attribute; the harness's timer, synchronize and comparison functions must stay "
                    "untouched",
                )
        elif any(qn == p or qn.startswith(p + ".") for p in LIBRARY_COMPILERS):
            self.ctx.add(
                FindingCode.library_call,
                line,
                f"line {line}: `{qn}` generates kernels from PyTorch ops; a candidate's kernels must be "
                "its own (load_inline or torch.cuda._compile_kernel)",
            )
        elif qn.startswith("torch.") and last in SEED_NAMES:
            self.ctx.add(
                FindingCode.seed_prediction,
                line,
                f"line {line}: `{qn}` reads or sets the random-number state; test inputs come from "
                "secret seeds and must not be predicted",
            )
        elif qn.startswith(("random.", "numpy.random.")) and last in {"seed", "get_state", "set_state", "getstate", "setstate", "default_rng", "RandomState"}:
            self.ctx.add(
                FindingCode.seed_prediction,
                line,
                f"line {line}: `{qn}` seeds or reads a random-number generator; test inputs come from "
                "secret seeds and must not be predicted",
            )
        elif qn.startswith("torch.") and last in PRECISION_SETTERS:
            self.ctx.add(
                FindingCode.precision_lowered,
                line,
                f"line {line}: `{qn}` changes PyTorch's global numerics, which the reference shares; "
                "keep the reference's precision and compute in your kernel at the problem's dtype",
            )
        elif qn.startswith("torch.") and last in {"use_deterministic_algorithms", "set_num_threads"}:
            self.ctx.add(
                FindingCode.harness_tampering,
                line,
                f"line {line}: `{qn}` changes global PyTorch settings the harness and reference share",
            )
        elif qn.startswith("torch.cuda.") and last in CUDA_STREAM_CALLS:
            self.ctx.add(
                FindingCode.unsynchronized_work,
                line,
                f"line {line}: `{qn}` runs work on another stream, which the harness's stream timer "
                "can miss; launch on the current stream (torch.cuda.current_stream())",
            )
        elif qn.startswith("torch.cuda.") and last in CUDA_LIBRARY_CALLS:
            self.ctx.add(
                FindingCode.library_call,
                line,
                f"line {line}: `{qn}` reaches cuBLAS; write the kernel yourself or use the `gemm` allow-list",
            )
        elif qn.startswith("torch.cuda.") and last in ALLOCATOR_CALLS:
            self.ctx.add(
                FindingCode.harness_tampering,
                line,
                f"line {line}: `{qn}` manipulates the CUDA memory allocator, which the harness uses to "
                "poison output buffers; allocate outputs with torch.empty/empty_like",
            )
        elif qn.startswith("torch.") and last in TENSOR_SUBCLASS_MAKERS:
            self.ctx.add(
                FindingCode.wrong_output_type,
                line,
                f"line {line}: `{qn}` builds a tensor subclass; ModelNew must return plain torch.Tensor "
                "objects computed in forward",
            )
        elif parts and parts[0] in INTROSPECTION and len(parts) == 2 and last in INTROSPECTION[parts[0]]:
            self.ctx.add(
                FindingCode.harness_tampering,
                line,
                f"line {line}: `{qn}` inspects the interpreter's objects or frames, which reaches the "
                "harness's own state (reference outputs, timers); candidates must not",
            )
        elif parts and parts[0] in CHANNEL_CALLS and len(parts) == 2 and last in CHANNEL_CALLS[parts[0]]:
            self.ctx.add(
                FindingCode.forged_result,
                line,
                f"line {line}: `{qn}` writes to file descriptors, forks or ends the process; a candidate "
                "must not touch the worker's channels or lifetime",
            )
        elif any(qn.startswith(m + ".") and last in names for m, names in THREAD_CALLS.items()):
            self.ctx.add(
                FindingCode.background_thread,
                line,
                f"line {line}: `{qn}` starts a thread or event loop; work done there can escape the "
                "timer. Do the work inside forward on the current stream",
            )
        elif last in {"cuCtxSetLimit", "cudaDeviceSetLimit", "cuStreamSetAttribute", "cudaStreamSetAttribute",
                      "cuCtxResetPersistingL2Cache", "cudaCtxResetPersistingL2Cache"}:
            self.ctx.add(
                FindingCode.l2_persistence,
                line,
                f"line {line}: `{ast.unparse(node.func)}` changes device limits or stream attributes "
                "(the L2 persisting set-aside and access-policy window); persisting lines survive the "
                "harness's L2 flush",
            )
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
        qn = _qualname(node, self.ctx.aliases) or ""
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
        root = _root_name(target)
        qn = _qualname(target, self.ctx.aliases) if isinstance(target, ast.Attribute) else None
        if qn and qn.startswith("torch.backends.") and qn.rsplit(".", 1)[-1] in PRECISION_FLAGS:
            self.ctx.add(
                FindingCode.precision_lowered,
                line,
                f"line {line}: assigning `{qn}` changes matmul/convolution precision for the reference "
                "too; compute at the problem's precision in your own kernel",
            )
            return
        if qn and (qn == "os.environ" or qn.startswith("os.environ.")) or _is_environ_item(target, self.ctx):
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
            qn = _qualname(base, self.ctx.aliases) or ""
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
            if isinstance(n, ast.Call) and (_qualname(n.func, self.ctx.aliases) or "").rsplit(".", 1)[-1] in BUILD_CALLS
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


def _is_environ_item(target: ast.AST, ctx: _Context) -> bool:
    return isinstance(target, ast.Subscript) and _qualname(target.value, ctx.aliases) == "os.environ"


def _is_main_guard(stmt: ast.stmt) -> bool:
    """`if __name__ == "__main__":` — code there never runs inside the harness."""
    test = getattr(stmt, "test", None)
    return (
        isinstance(stmt, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
    )


def _check_strings(tree: ast.Module, ctx: _Context, parents: dict[ast.AST, ast.AST]) -> None:
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if _is_docstring(node, parents):
            continue
        text = node.value
        lowered = text.lower()
        # Library names handed to ctypes or dlopen, in any string.
        for lib, code, label in (("cublas", FindingCode.library_call, "cublas"), ("cudnn", FindingCode.library_call, "cudnn")):
            if re.search(rf"\blib{lib}\w*\.so", lowered) and label not in ctx.allow:
                ctx.add(code, node.lineno, f"line {node.lineno}: the candidate loads {lib} ('{text[:60]}'); "
                        "compute with your own kernel")
        if not _looks_like_cpp(text):
            continue
        code_text = _strip_cpp_comments(text)
        seen: set[tuple[FindingCode, int]] = set()
        for rule in _CPP_RULES:
            if rule.allow_key and rule.allow_key in ctx.allow:
                continue
            for m in rule.pattern.finditer(code_text):
                line = node.lineno + code_text[: m.start()].count("\n")
                if (rule.code, line) in seen:
                    continue
                seen.add((rule.code, line))
                ctx.add(rule.code, line, f"line {line}: " + rule.message.format(match=m.group(0).strip()))
        for pattern, what in ((_CPP_TORCH_OP, "a PyTorch op"), (_CPP_TENSOR_METHOD, "a tensor method")):
            for m in pattern.finditer(code_text):
                op = m.group(1)
                if op in ctx.allow:
                    continue
                line = node.lineno + code_text[: m.start()].count("\n")
                ctx.add(
                    FindingCode.library_call,
                    line,
                    f"line {line}: C++ source calls {what} `{m.group(0).strip().rstrip('(').strip()}`; "
                    "compute it in your own kernel (torch::empty and friends are fine)",
                )


def check_source(source: str, allow: Collection[str] = ()) -> list[Finding]:
    """Static findings for a candidate's source, each with a line number and an actionable message.

    `allow` is an allow-list (see `expand_allow`): e.g. `["gemm"]` permits torch.matmul, F.linear,
    nn.Linear and cuBLAS for GEMM problems. A file that does not parse yields no findings here: the
    compile step reports syntax errors with their own verdict.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    tree.body = [stmt for stmt in tree.body if not _is_main_guard(stmt)]
    ctx = _Context(allow=expand_allow(allow))
    _collect_imports(tree, ctx)
    _collect_defs(tree, ctx)
    _collect_extensions(tree, ctx)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    _FileVisitor(ctx, parents).visit(tree)
    _check_strings(tree, ctx, parents)
    model = ctx.classes.get("ModelNew")
    if model is not None:
        for base in model.bases:
            qn = _qualname(base, ctx.aliases) or ""
            if qn.rsplit(".", 1)[-1] == "Model" and isinstance(base, ast.Attribute):
                ctx.add(
                    FindingCode.reference_fallback,
                    model.lineno,
                    f"line {model.lineno}: ModelNew subclasses the reference `{qn}`; it must compute the "
                    "result itself",
                )
        visitor = _ForwardVisitor(ctx, _nn_module_attrs(model, ctx))
        for fn in _reachable_from_forward(ctx):
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
        tree = ast.parse(source)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _looks_like_cpp(node.value):
            yield node.lineno, node.value
