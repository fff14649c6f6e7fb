"""Tracing a problem's model into a graph, splitting it into parts, and checking a recomposition
(worker side: runs only inside the sandbox; a problem is untrusted code).

    python -m kb_mcp.harness.worker.decompose_trace REQUEST.json RESULT.json

REQUEST is `{"action": "trace" | "split" | "check", "problems": [...]}`; RESULT gets one entry per
problem, in order, each `{"ok": true, ...}` or `{"ok": false, "error": "..."}`. The server side
(`kb_mcp.decomposition`) groups the traced graph into parts and writes the part files; this module
only does what needs torch:

* trace: the model built at its real sizes without allocating them (the meta device; a fake-tensor
  mode with a shape environment where construction reads a value, as `.item()` does), traced by
  `torch.fx.symbolic_trace` (torch.nn modules stay leaves), else by non-strict `torch.export` (outputs
  flattened, parameters put back as attributes), else not at all (the whole model is one part). Each
  node's result shape, FLOPs (`FlopCounterMode`) and bytes come from one run on meta/fake tensors.
* split: the same trace, cut by the server's assignment of nodes to parts (`fx.passes.split_module`):
  each part's forward source, the torch.nn modules it calls (constructor text), the tensors it reads
  (parameters, buffers: small buffers with their values, read from a CPU build), its inputs' shapes,
  and the glue (the top-level forward calling the parts).
* check: the model built for real (seeded; `batch_size` reduced where the problem has one), a
  composed candidate's ModelNew loaded with the model's state dict, both run on the same inputs:
  whether the outputs are bit-identical.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import json
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.passes.split_module import split_module
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from kb_mcp.harness.worker.loading import load_module

EMBED_LIMIT = 1 << 22  # buffers up to this many elements are written into a part with their values
CPU_BUILD_LIMIT = 4 << 30  # bytes of parameters a model may have to be built on the CPU for buffer values


class Built:
    """A problem's model and inputs at real sizes, and the mode they live in."""

    def __init__(self, module: Any, model: nn.Module, inputs: list[Any], mode: Any, device: str) -> None:
        self.module = module
        self.model = model
        self.inputs = inputs
        self.mode = mode  # the FakeTensorMode the model was built in, or None (meta)
        self.device = device  # "meta" or "fake"

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """Where to run the model: inside its fake mode, if it has one."""
        return self.mode if self.mode is not None else contextlib.nullcontext()


def build(module: Any) -> Built:
    """The model (eval mode) and one input set at real sizes, on the meta device or as fake tensors."""
    try:
        with torch.device("meta"):
            model = module.Model(*module.get_init_inputs()).eval()
            inputs = list(module.get_inputs())
        return Built(module, model, inputs, None, "meta")
    except Exception:  # noqa: BLE001 - construction reads a value (.item()): fake tensors can
        pass
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    with mode:
        model = module.Model(*module.get_init_inputs()).eval()
        inputs = list(module.get_inputs())
    return Built(module, model, inputs, mode, "fake")


class _Flat(nn.Module):
    """The model with its outputs flattened to a tuple of tensors (export refuses some structures)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any) -> tuple[Any, ...]:
        return tuple(tree_leaves(self.model(*args)))


def _unlift(built: Built) -> fx.GraphModule:
    """torch.export's graph with parameters and buffers as attributes under the model's own names."""
    with built.context():
        ep = torch.export.export(_Flat(built.model), tuple(built.inputs), strict=False)
    sig = ep.graph_signature
    named = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    graph = ep.graph_module.graph
    first = next(n for n in graph.nodes if n.op != "placeholder")
    root = nn.Module()
    for node in list(graph.nodes):
        if node.op == "placeholder" and node.name in named:
            target = named[node.name].removeprefix("model.")
            with graph.inserting_before(first):
                attr = graph.get_attr(target)
            attr.meta = dict(node.meta)
            node.replace_all_uses_with(attr)
            graph.erase_node(node)
            value = ep.constants[named[node.name]] if node.name in sig.inputs_to_lifted_tensor_constants \
                else _attr(built.model, target)
            value = getattr(value, "constant", None) if getattr(value, "constant", None) is not None else value
            _install(root, target, value)
    if sig.buffers_to_mutate or sig.user_inputs_to_mutate:
        raise RuntimeError("the exported graph mutates buffers or inputs")
    for node in graph.nodes:
        if node.op == "output":  # export's output is a flat tuple: one tensor stays a tuple of one
            node.args = (tuple(node.args[0]),)
    fresh = fx.Graph()  # the edited graph still belongs to export's module: a copy belongs to ours
    fresh.output(fresh.graph_copy(graph, {}))
    gm = fx.GraphModule(root, fresh)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    return gm


def _attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _install(root: nn.Module, target: str, value: Any) -> None:
    *path, leaf = target.split(".")
    obj = root
    for part in path:
        if not hasattr(obj, part):
            obj.add_module(part, nn.Module())
        obj = getattr(obj, part)
    if isinstance(value, nn.Parameter):
        obj.register_parameter(leaf, value)
    elif isinstance(value, torch.Tensor):
        obj.register_buffer(leaf, value)
    else:
        setattr(obj, leaf, value)


def trace(built: Built) -> tuple[fx.GraphModule, str, list[str]]:
    """(graph, method, why the methods before it failed): fx first, then non-strict export."""
    failures: list[str] = []
    try:
        return _fx(built.model), "fx", failures
    except Exception as exc:  # noqa: BLE001 - any tracing failure moves on to the next method
        failures.append(f"fx: {type(exc).__name__}: {str(exc)[:200]}")
    try:
        return _unlift(built), "export", failures
    except Exception as exc:  # noqa: BLE001 - as above; the whole model is then one part
        failures.append(f"export: {type(exc).__name__}: {str(exc)[:200]}")
    raise TraceFailed("; ".join(failures))


class _Leaves(fx.Tracer):
    """fx's tracer, keeping as leaves only the torch.nn modules a part file can rebuild."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return super().is_leaf_module(m, module_qualified_name) and constructor(m) is not None


def _fx(model: nn.Module) -> fx.GraphModule:
    before = dict(vars(model))
    graph = _Leaves().trace(model)
    # A forward that assigns to the model (`self.h0 = self.h0.to(x.device)`) left fx's proxies there: the
    # model gets its values back, and the graph reads them as they were before the call.
    vars(model).update({k: v for k, v in before.items() if vars(model).get(k) is not v})
    return fx.GraphModule(model, graph, type(model).__name__)


class TraceFailed(RuntimeError):
    """No method traced the model (the server makes the whole model one part)."""


def summary(value: Any) -> Any:
    """A node result as JSON: a tensor's shape and dtype, a plain value, or a list of them."""
    if isinstance(value, torch.Tensor):
        return {"shape": [int(s) for s in value.shape], "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, (list, tuple)):
        return [summary(v) for v in value]
    if isinstance(value, torch.Size):
        return {"value": [int(s) for s in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        return {"value": None, "symbolic": str(value)}
    return {"value": None, "type": type(value).__name__}


def _bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


class Recorder(fx.Interpreter):
    """Runs the graph on meta/fake tensors, keeping each node's result summary, FLOPs and bytes."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.nodes: list[dict[str, Any]] = []

    def run_node(self, n: fx.Node) -> Any:
        counter = FlopCounterMode(display=False)
        called: Any = self.module.get_submodule(str(n.target)) if n.op == "call_module" else None
        first: Any = self.env.get(n.args[0]) if n.args and isinstance(n.args[0], fx.Node) else None
        recurrent = isinstance(called, nn.RNNBase)
        with counter:
            # a recurrent module on meta tensors runs its steps one by one in Python: its shapes and
            # FLOPs are computed instead
            result = recurrent_result(called, first) if recurrent else super().run_node(n)
        ins = [self.env[a] for a in n.all_input_nodes if a in self.env]
        self.nodes.append({
            "name": n.name, "op": n.op, "target": _target_name(n), "args": [a.name for a in n.all_input_nodes],
            "module_type": _module_type(called), "result": summary(result),
            "flops": recurrent_flops(called, first) if recurrent else int(counter.get_total_flops()),
            "bytes": (_bytes(ins) + _bytes(result)) if n.op not in ("placeholder", "get_attr", "output") else 0,
        })
        return result


def recurrent_result(m: nn.RNNBase, x: torch.Tensor) -> Any:
    """Empty tensors shaped as a recurrent module's outputs for input `x` (output, h_n[, c_n])."""
    directions = 2 if m.bidirectional else 1
    batched = x.dim() == 3
    seq, batch = (x.shape[1], x.shape[0]) if m.batch_first and batched else (x.shape[0], x.shape[1] if batched else 1)
    out_size = directions * (m.proj_size or m.hidden_size)
    out_shape = ((batch, seq, out_size) if m.batch_first else (seq, batch, out_size)) if batched else (seq, out_size)
    h_shape = (directions * m.num_layers, batch, m.proj_size or m.hidden_size) if batched else \
        (directions * m.num_layers, m.proj_size or m.hidden_size)
    output, h_n = x.new_empty(out_shape), x.new_empty(h_shape)
    if isinstance(m, nn.LSTM):
        c_shape = (*h_shape[:-1], m.hidden_size)
        return output, (h_n, x.new_empty(c_shape))
    return output, h_n


def recurrent_flops(m: nn.RNNBase, x: torch.Tensor) -> int:
    """Multiply-adds x2 of a recurrent module's gate GEMMs over the sequence."""
    gates = {"LSTM": 4, "GRU": 3}.get(m.mode, 1)
    directions = 2 if m.bidirectional else 1
    steps = x.shape[1] if m.batch_first and x.dim() == 3 else x.shape[0]
    rows = int(x.numel() // x.shape[-1])  # batch x sequence
    total, width = 0, m.input_size
    for _ in range(m.num_layers):
        total += 2 * rows * gates * m.hidden_size * (width + m.hidden_size) * directions
        width = directions * (m.proj_size or m.hidden_size)
    return int(total) if steps else 0


def _target_name(n: fx.Node) -> str:
    if n.op == "call_function":
        t = n.target
        if isinstance(t, torch._ops.OpOverload):
            return str(t)
        return f"{getattr(t, '__module__', '')}.{getattr(t, '__name__', t)}"
    return str(n.target)


def _module_type(m: nn.Module | None) -> str:
    return "" if m is None else f"{type(m).__module__}.{type(m).__qualname__}"


def trace_problem(module: Any) -> dict[str, Any]:
    """The traced graph of a problem's model: nodes with shapes, FLOPs and bytes."""
    built = build(module)
    try:
        gm, method, failures = trace(built)
    except TraceFailed as exc:
        return {"method": "whole", "built_on": built.device, "failures": [str(exc)], "nodes": [],
                "inputs": [summary(x) for x in built.inputs], **_whole_cost(built)}
    rec = Recorder(gm)
    with built.context():
        rec.run(*built.inputs)
    return {"method": method, "built_on": built.device, "failures": failures, "nodes": rec.nodes,
            "inputs": [summary(x) for x in built.inputs]}


def _whole_cost(built: Built) -> dict[str, Any]:
    counter = FlopCounterMode(display=False)
    with built.context(), counter:
        out = built.model(*built.inputs)
    params = _bytes(list(built.model.parameters()))
    return {"flops": int(counter.get_total_flops()), "bytes": _bytes(built.inputs) + _bytes(out) + params,
            "output": summary(out)}


# -- split -----------------------------------------------------------------------------------------


def _encoder_layer(m: nn.TransformerEncoderLayer) -> str:
    """nn.TransformerEncoderLayer's constructor text (its activation is a function, not an attribute)."""
    act = {1: "'relu'", 2: "'gelu'"}.get(int(getattr(m, "activation_relu_or_gelu", 0)), "'relu'")
    return (f"nn.TransformerEncoderLayer(d_model={m.self_attn.embed_dim}, nhead={m.self_attn.num_heads}, "
            f"dim_feedforward={m.linear1.out_features}, dropout={m.dropout.p}, activation={act}, "
            f"layer_norm_eps={m.norm1.eps}, batch_first={m.self_attn.batch_first}, norm_first={m.norm_first}, "
            f"bias={m.linear1.bias is not None})")


def constructor(m: nn.Module) -> str | None:
    """Python text that builds a torch.nn module like `m` (`nn.Conv2d(in_channels=3, ...)`), checked by
    building it on the meta device and comparing its repr and state; None where that fails."""
    cls = type(m)
    if not cls.__module__.startswith("torch.nn"):
        return None
    aliases = {"bias": ("bias", "in_proj_bias"), "add_bias_kv": ("bias_k",)}
    args = []
    init = nn.RNNBase.__init__ if issubclass(cls, nn.RNNBase) else cls.__init__  # LSTM/GRU take *args
    for name, p in list(inspect.signature(init).parameters.items())[1:]:
        if name in ("device", "dtype", "mode") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        found = next(((a, getattr(m, a)) for a in aliases.get(name, (name,)) if hasattr(m, a)), None)
        if found is None:
            continue
        value = found[1]
        if isinstance(p.default, bool) and (value is None or isinstance(value, torch.Tensor)):
            value = value is not None
        if isinstance(value, (bool, int, float, str, tuple, type(None))) and _literal(value):
            args.append(f"{name}={value!r}")
    text = _encoder_layer(m) if isinstance(m, nn.TransformerEncoderLayer) else f"nn.{cls.__name__}({', '.join(args)})"
    try:
        with torch.device("meta"):
            made = eval(text, {"nn": nn})  # our own text, built from a torch.nn class's own attributes
    except Exception:  # noqa: BLE001 - a class whose signature and attributes disagree
        return None
    same = repr(made) == repr(m) and {k: tuple(v.shape) for k, v in made.state_dict().items()} == {
        k: tuple(v.shape) for k, v in m.state_dict().items()}
    dtypes = {v.dtype for v in m.state_dict().values() if v.is_floating_point()}
    if dtypes and dtypes != {torch.float32}:
        text += f".to({next(iter(dtypes))})"
    return text if same else None


def _literal(value: Any) -> bool:
    try:
        return eval(repr(value), {}) == value  # only values whose repr reads back (no objects)
    except Exception:  # noqa: BLE001
        return False


def _encode(t: torch.Tensor) -> str:
    return base64.b64encode(zlib.compress(t.detach().cpu().contiguous().numpy().tobytes(), 9)).decode()


class _Capture:
    """The inputs each part is called with, recorded by forward pre-hooks during one run."""

    def __init__(self, split: fx.GraphModule) -> None:
        self.seen: dict[str, list[Any]] = {}
        self.handles = [m.register_forward_pre_hook(self._hook(name)) for name, m in parts_of(split)]

    def _hook(self, name: str) -> Any:
        def hook(_m: nn.Module, args: tuple[Any, ...]) -> None:
            self.seen.setdefault(name, [summary(a) for a in args])
        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def split_problem(module: Any, assignment: dict[str, int]) -> dict[str, Any]:
    """The model cut into parts by `assignment` (node name -> part number): each part's source pieces."""
    built = build(module)
    gm, method, _ = trace(built)
    missing = [n.name for n in gm.graph.nodes if n.op not in ("placeholder", "output") and n.name not in assignment]
    if missing:
        raise ValueError(f"the assignment leaves nodes out: {missing[:5]}")
    split = split_module(gm, built.model, lambda n: assignment[n.name], keep_original_order=True)
    own_attributes(split)
    names = {id(m): name for name, m in built.model.named_modules()}
    for _, sub in parts_of(split):
        model_names(sub, names)
        devices_from_inputs(sub)
    capture = _Capture(split)
    with built.context():
        split(*built.inputs)
    capture.close()
    real = _cpu_model(module, built, split)
    parts = []
    for name, sub in parts_of(split):
        parts.append(_part_pieces(name, sub, capture.seen.get(name, []), real))
    return {"method": method, "parts": parts, "glue": split.code, "glue_globals": _globals(split)}


def own_attributes(split: fx.GraphModule) -> None:
    """Parameters and buffers a part reads become its own attributes (split_module passes them in as
    arguments), so that a part holds its state under the model's names."""
    for call in [n for n in split.graph.nodes if n.op == "call_module"]:
        sub: Any = split.get_submodule(str(call.target))
        holders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        keep = []
        for arg, holder in zip(call.args, holders):
            if isinstance(arg, fx.Node) and arg.op == "get_attr":
                _install(sub, str(arg.target), _attr(split, str(arg.target)))
                with sub.graph.inserting_after(holders[-1]):
                    got = sub.graph.get_attr(str(arg.target))
                holder.replace_all_uses_with(got)
                sub.graph.erase_node(holder)
            else:
                keep.append(arg)
        call.args = tuple(keep)
        sub.recompile()
    split.graph.eliminate_dead_code()
    split.recompile()


def model_names(sub: fx.GraphModule, names: dict[int, str]) -> None:
    """The modules a part calls put back at the model's names (split_module flattens `layer1.0.conv1`
    to `layer1_0_conv1`)."""
    for n in sub.graph.nodes:
        if n.op != "call_module":
            continue
        m = sub.get_submodule(str(n.target))
        name = names.get(id(m), str(n.target))
        if name != n.target:
            delattr(sub, str(n.target)) if "." not in str(n.target) else None
            _install(sub, name, m)
            n.target = name
    sub.recompile()


def devices_from_inputs(sub: fx.GraphModule) -> None:
    """A device written into the graph as a constant (export bakes in the meta device) read from the
    part's first tensor input instead, so the part runs where its inputs are."""
    baked = [n for n in sub.graph.nodes if isinstance(n.kwargs.get("device"), torch.device)]
    first = next((n for n in sub.graph.nodes if n.op == "placeholder"
                  and isinstance(n.meta.get("val", n.meta.get("example_value")), torch.Tensor)), None)
    first = first or next((n for n in sub.graph.nodes if n.op in ("placeholder", "get_attr")), None)
    if not baked or first is None:
        return
    with sub.graph.inserting_after(first):
        device = sub.graph.call_function(getattr, (first, "device"))
    for n in baked:
        n.kwargs = {**n.kwargs, "device": device}
    sub.recompile()


def parts_of(split: fx.GraphModule) -> list[tuple[str, fx.GraphModule]]:
    """The split's parts (`submod_N`), in order."""
    return [(name, m) for name, m in split.named_children() if isinstance(m, fx.GraphModule)]


def _globals(gm: fx.GraphModule) -> list[str]:
    """Names the generated code needs beyond `torch` (fx's code refers to some objects by name)."""
    code = gm.graph.python_code(root_module="self")
    return sorted(k for k in code.globals if k not in ("torch", "getattr", "NoneType"))


def _cpu_model(module: Any, built: Built, split: fx.GraphModule) -> nn.Module | None:
    """The model built on the CPU, where a part reads buffers whose values matter (masks, indices)."""
    wants = any(n.op == "get_attr" and isinstance(_attr(sub, str(n.target)), torch.Tensor)
                and not isinstance(_attr(sub, str(n.target)), nn.Parameter)
                for _, sub in parts_of(split) for n in sub.graph.nodes)
    if not wants or _bytes(list(built.model.parameters())) > CPU_BUILD_LIMIT:
        return None
    torch.manual_seed(0)
    return module.Model(*module.get_init_inputs()).eval()


def _part_pieces(name: str, sub: fx.GraphModule, inputs: list[Any], real: nn.Module | None) -> dict[str, Any]:
    modules, tensors = {}, {}
    for n in sub.graph.nodes:
        if n.op == "call_module":
            m = sub.get_submodule(str(n.target))
            modules[str(n.target)] = {"ctor": constructor(m), "type": type(m).__name__, "keys": list(m.state_dict())}
        elif n.op == "get_attr":
            t = _attr(sub, str(n.target))
            if isinstance(t, torch.Tensor):
                tensors[str(n.target)] = _tensor_piece(str(n.target), t, real)
    placeholders = [n.name for n in sub.graph.nodes if n.op == "placeholder"]
    return {"name": name, "code": sub.code, "modules": modules, "tensors": tensors,
            "inputs": [{"name": p, "summary": s} for p, s in zip(placeholders, inputs)],
            "globals": _globals(sub)}


def _tensor_piece(target: str, t: torch.Tensor, real: nn.Module | None) -> dict[str, Any]:
    piece: dict[str, Any] = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                             "parameter": isinstance(t, nn.Parameter)}
    if piece["parameter"] or t.numel() > EMBED_LIMIT:
        return piece
    if real is not None:
        with contextlib.suppress(AttributeError):
            piece["values"] = _encode(_attr(real, target))
    if "values" not in piece and _has_values(t):
        # a constant the forward makes (export lifts `torch.tensor(...)`): the model holds no such attribute,
        # but export computed it for real
        piece["values"] = _encode(t)
    return piece


def _has_values(t: torch.Tensor) -> bool:
    """Whether a tensor holds real numbers (not a meta or fake tensor)."""
    return not isinstance(t, FakeTensor) and t.device.type != "meta"


# -- check -----------------------------------------------------------------------------------------


SHRINK_FROM = 128  # sizes from this up are divided by SHRINK_BY where a check shrinks a model
SHRINK_BY = 4


def _shrunk(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value >= SHRINK_FROM:
        return value // SHRINK_BY
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [_shrunk(v) for v in value]
    return value


@contextlib.contextmanager
def reduced_batch(module: Any, batch: int | None, shrink: bool = False) -> Iterator[None]:
    """The problem's `batch_size` set to `batch` while it builds its model and inputs; with `shrink`,
    its other module-level sizes (ints and lists of ints from SHRINK_FROM up) divided by SHRINK_BY, for
    models whose real sizes do not fit a small machine."""
    names = [k for k, v in vars(module).items() if not k.startswith("_") and _shrunk(v) is not v] if shrink else []
    old = {k: getattr(module, k) for k in [*names, "batch_size"] if hasattr(module, k)}
    for k in names:
        setattr(module, k, _shrunk(old[k]))
    if batch is not None and isinstance(old.get("batch_size"), int) and old["batch_size"] > batch:
        module.batch_size = batch
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


def check_problem(module: Any, composed: Any, batch: int | None, shrink: bool = False) -> dict[str, Any]:
    """Whether the composed ModelNew, with the model's state dict, reproduces the model's output exactly."""
    with reduced_batch(module, batch, shrink):
        torch.manual_seed(0)
        init = module.get_init_inputs()
        model = module.Model(*init).eval()
        torch.manual_seed(1)
        inputs = module.get_inputs()
    torch.manual_seed(2)
    cand = composed.ModelNew(*init).eval()
    result = cand.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        want = tree_leaves(model(*inputs))
        got = tree_leaves(cand(*inputs))
    same = len(want) == len(got) and all(
        isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and w.shape == g.shape and w.dtype == g.dtype
        and torch.equal(w, g) for w, g in zip(want, got))
    diff = max((float((w.double() - g.double()).abs().max()) for w, g in zip(want, got)
                if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and w.shape == g.shape
                and w.numel()), default=0.0)
    return {"exact": same, "max_abs_diff": diff, "outputs": len(want),
            "missing_keys": list(result.missing_keys), "unexpected_keys": list(result.unexpected_keys),
            "input_shapes": [summary(x) for x in inputs]}


# -- the command -------------------------------------------------------------------------------------


def run_one(action: str, entry: dict[str, Any], index: int, workdir: Path) -> dict[str, Any]:
    """One problem of a request."""
    module = load_module(entry["source"], f"kbmcp_problem_{index}", workdir)
    if action == "trace":
        with reduced_batch(module, entry.get("batch"), entry.get("shrink", False)):
            return trace_problem(module)
    if action == "split":
        with reduced_batch(module, entry.get("batch"), entry.get("shrink", False)):
            return split_problem(module, {str(k): int(v) for k, v in entry["assignment"].items()})
    if action == "check":
        composed = load_module(entry["composed"], f"kbmcp_composed_{index}", workdir)
        return check_problem(module, composed, entry.get("batch"), entry.get("shrink", False))
    raise ValueError(f"unknown action {action!r}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m kb_mcp.harness.worker.decompose_trace REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    workdir = Path(argv[1]).resolve().parent / "modules"
    torch.set_num_threads(max(1, int(request.get("threads", 1))))
    results = []
    for i, entry in enumerate(request["problems"]):
        try:
            results.append({"ok": True, **run_one(request["action"], entry, i, workdir)})
        except Exception as exc:  # noqa: BLE001 - a problem's failure is reported, the next one runs
            results.append({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:1500]}"})
        Path(argv[1]).write_text(json.dumps(results))  # written as it goes: a crash keeps what was done
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
