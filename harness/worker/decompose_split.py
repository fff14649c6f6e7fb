"""A traced model cut into parts by the server's assignment of nodes to parts (worker side of a
decomposition: runs only inside the sandbox). See `decompose_trace` for the request.

`fx.passes.split_module` cuts the graph; each part gets its forward source, the torch.nn modules it
calls (constructor text), the tensors it reads (parameters, buffers: small buffers with their values,
read from a CPU build; constants the forward makes, with the values export computed), its inputs'
shapes, and the glue (the top-level forward calling the parts).
"""

from __future__ import annotations

import base64
import contextlib
import zlib
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.passes.split_module import split_module

from kb_mcp.harness.worker.decompose_graph import (
    Built,
    attr_at,
    build,
    constructor,
    install,
    recurrent_shapes,
    summary,
    tensor_bytes,
    trace,
)

EMBED_LIMIT = 1 << 22  # buffers up to this many elements are written into a part with their values
CPU_BUILD_LIMIT = 4 << 30  # bytes of parameters a model may have to be built on the CPU for buffer values


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
    with built.context(), recurrent_shapes():
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
                install(sub, str(arg.target), attr_at(split, str(arg.target)))
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
            install(sub, name, m)
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
    wants = any(n.op == "get_attr" and isinstance(attr_at(sub, str(n.target)), torch.Tensor)
                and not isinstance(attr_at(sub, str(n.target)), nn.Parameter)
                for _, sub in parts_of(split) for n in sub.graph.nodes)
    if not wants or tensor_bytes(list(built.model.parameters())) > CPU_BUILD_LIMIT:
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
            t = attr_at(sub, str(n.target))
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
            piece["values"] = _encode(attr_at(real, target))
    if "values" not in piece and _has_values(t):
        # a constant the forward makes (export lifts `torch.tensor(...)`): the model holds no such attribute,
        # but export computed it for real
        piece["values"] = _encode(t)
    return piece


def _has_values(t: torch.Tensor) -> bool:
    """Whether a tensor holds real numbers (not a meta or fake tensor)."""
    return not isinstance(t, FakeTensor) and t.device.type != "meta"


