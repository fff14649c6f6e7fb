"""A problem's model built at its real sizes without allocating them, and traced into a graph (worker
side of a decomposition: runs only inside the sandbox). See `decompose_trace` for the request.

The model is built on the meta device, or under a fake-tensor mode with a shape environment where
construction reads a value (`.item()`); traced by `torch.fx.symbolic_trace` (torch.nn modules a part
file can rebuild stay leaves), else by non-strict `torch.export` (outputs flattened, parameters put
back as attributes). Each node's result shape, FLOPs and bytes come from one run on meta/fake tensors.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode


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
                else attr_at(built.model, target)
            value = getattr(value, "constant", None) if getattr(value, "constant", None) is not None else value
            install(root, target, value)
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


def attr_at(root: nn.Module, target: str) -> Any:
    """The attribute at a dotted name (`layer1.0.conv1.weight`)."""
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def install(root: nn.Module, target: str, value: Any) -> None:
    """Puts a parameter, buffer or value at a dotted name, making the modules above it."""
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


def tensor_bytes(value: Any) -> int:
    """The bytes of the tensors in a (nested) value."""
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
            "bytes": 0 if n.op in ("placeholder", "get_attr", "output") else tensor_bytes(ins) + tensor_bytes(result),
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


@contextlib.contextmanager
def recurrent_shapes() -> Iterator[None]:
    """Recurrent modules answer empty tensors of their outputs' shapes while the model runs on meta or
    fake tensors (their own forward would run every step in Python: tens of seconds for a long sequence)."""
    real = nn.RNNBase.forward

    def forward(self: nn.RNNBase, x: torch.Tensor, hx: Any = None) -> Any:
        return recurrent_result(self, x)

    nn.RNNBase.forward = forward
    try:
        yield
    finally:
        nn.RNNBase.forward = real


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
    params = tensor_bytes(list(built.model.parameters()))
    return {"flops": int(counter.get_total_flops()), "bytes": tensor_bytes(built.inputs) + tensor_bytes(out) + params,
            "output": summary(out)}


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
        if name == "proj_size" and not isinstance(m, nn.LSTM):  # RNNBase's argument that only LSTM takes
            continue
        found = next(((a, getattr(m, a)) for a in aliases.get(name, (name,)) if hasattr(m, a)), None)
        if found is None:
            continue
        value = found[1]
        if isinstance(p.default, bool) and (value is None or isinstance(value, torch.Tensor)):
            value = value is not None
        if isinstance(value, (bool, int, float, str, tuple, type(None))) and _literal(value):
            args.append((f"{name}={value!r}", p.default is not p.empty and _same(value, p.default)))
    if isinstance(m, nn.TransformerEncoderLayer):
        texts = [_encoder_layer(m)]
    else:  # the arguments the module does not leave at their defaults first, all of them if that differs
        texts = [f"nn.{cls.__name__}({', '.join(a for a, default in args if not default)})",
                 f"nn.{cls.__name__}({', '.join(a for a, _ in args)})"]
    text = next((t for t in texts if _builds_like(t, m)), None)
    if text is None:
        return None
    dtypes = {v.dtype for v in m.state_dict().values() if v.is_floating_point()}
    if dtypes and dtypes != {torch.float32}:
        text += f".to({next(iter(dtypes))})"
    return text


def _same(value: Any, default: Any) -> bool:
    """Whether an attribute's value is the argument's default (`stride=(1, 1)` is `stride=1`'s)."""
    if isinstance(value, tuple) and isinstance(default, int) and not isinstance(default, bool):
        return all(type(v) is int and v == default for v in value)
    return type(value) is type(default) and value == default


def _builds_like(text: str, m: nn.Module) -> bool:
    """Whether `text` builds (on the meta device) a module with `m`'s repr and state shapes."""
    try:
        with torch.device("meta"):
            made = eval(text, {"nn": nn})  # our own text, built from a torch.nn class's own attributes
    except Exception:  # noqa: BLE001 - a class whose signature and attributes disagree
        return False
    return repr(made) == repr(m) and {k: tuple(v.shape) for k, v in made.state_dict().items()} == {
        k: tuple(v.shape) for k, v in m.state_dict().items()}


def _literal(value: Any) -> bool:
    try:
        return eval(repr(value), {}) == value  # only values whose repr reads back (no objects)
    except Exception:  # noqa: BLE001
        return False



# -- sizes for checks ------------------------------------------------------------------------------


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


SHRINK_PARAMETER_BYTES = 256 << 20  # models with more parameters than this are shrunk for a check ("auto")


def wants_shrink(module: Any, batch: int | None) -> bool:
    """Whether a check should shrink the model ("auto"): its parameters at the check's batch are larger
    than SHRINK_PARAMETER_BYTES (building and initialising them for real would dominate the check), and
    the model still builds and runs on meta tensors with its sizes divided."""
    with reduced_batch(module, batch):
        with torch.device("meta"):
            try:
                model = module.Model(*module.get_init_inputs())
            except Exception:  # noqa: BLE001 - a model that needs fake tensors: size it there
                return False
        if tensor_bytes(list(model.parameters())) + tensor_bytes(list(model.buffers())) <= SHRINK_PARAMETER_BYTES:
            return False
    try:
        with reduced_batch(module, batch, shrink=True), torch.device("meta"), recurrent_shapes():
            small = module.Model(*module.get_init_inputs()).eval()
            small(*module.get_inputs())
    except Exception:  # noqa: BLE001 - sizes that do not divide: checked at the real ones
        return False
    return True
