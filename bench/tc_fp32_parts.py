"""Candidates for the Linear parts of a decomposed model, from the strict-FP32 tensor-core GEMM.

A part of `kb-mcp decompose` (docs/models.md) that is one nn.Linear with an optional pointwise op gets
the core of bench/tc_fp32/gemm_core.cu with the bias and the op as its epilogue, the Linear held at the
part's own dotted name so the model's state dict loads into it (`part_candidate`). The core and the
file's templates are bench/tc_fp32_sync.py's, the only writer of the core's copies; its `--part`
option and bench/l3_linear_parts.py call this module.
"""

from __future__ import annotations

import ast
import json
import keyword
from dataclasses import dataclass
from pathlib import Path

from tc_fp32_sync import (
    _HEAD,
    _LOAD,
    _METHOD,
    _SOURCES,
    EXT_PREFIX,
    VARIANT_MARK,
    _epilogue_note,
    _orientation,
    render_cpp,
    render_cuda,
)

# A part file is generated code of a known shape: its Model's constructor places modules and
# parameters at the model's dotted names (`_place(self, "network.0", nn.Linear(...))`, or with an
# export trace the parameters themselves), and its forward is straight-line code. The part is read
# from its syntax tree, never run: it comes from the model, which is untrusted code.


@dataclass(frozen=True)
class Activation:
    """A pointwise op a part may apply to its Linear's output, and the epilogue that computes it."""

    modules: frozenset[str]  # its torch.nn class, as a part file spells it
    functions: frozenset[str]  # its calls in a traced forward: torch's, functional's and ATen's spellings
    cuda: str  # the expression on x, the biased dot product


def _spellings(op: str) -> frozenset[str]:
    return frozenset({f"torch.{op}", f"F.{op}", f"torch.nn.functional.{op}", f"torch.ops.aten.{op}.default"})


# The ones level 3's Linear parts hold: ReLU (the MLPs, LeNet-5), tanh (the RNNs), erf GELU (SwinMLP).
ACTIVATIONS: dict[str, Activation] = {
    "relu": Activation(frozenset({"nn.ReLU"}), _spellings("relu"), "x < 0.0f ? 0.0f : x"),  # NaN stays NaN, as torch's
    "tanh": Activation(frozenset({"nn.Tanh"}), _spellings("tanh"), "tanhf(x)"),
    "gelu": Activation(frozenset({"nn.GELU"}), _spellings("gelu"), "gelu_erf(x)"),
}
LINEAR_CALLS = frozenset({"F.linear", "torch.nn.functional.linear", "torch.ops.aten.linear.default"})
DROPOUTS = _spellings("dropout") | {"nn.Dropout"}  # an identity where it drops nothing (p 0 or not training)
# Keyword arguments of those calls that leave the op as the epilogue computes it.
_NEUTRAL = {"inplace": (True, False), "approximate": ("none",)}


class PartRefused(ValueError):
    """A part the core cannot serve; the message says why."""


@dataclass(frozen=True)
class LinearPart:
    """A part that computes activation(Linear(x)): what its candidate needs of it."""

    problem: str  # the model, as its decomposition names it
    part: str  # part01
    name: str  # the Linear's dotted name in the model: network.0
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a key of ACTIVATIONS, "" for none
    makes: tuple[str, ...]  # the part's own lines that make the Linear's parameters, in its order
    place: str  # the part's `_place` helper, which those lines call

    @property
    def ext_name(self) -> str:
        # one per epilogue: the parts of a composed model that share one share its build
        return f"{EXT_PREFIX}part_{self.activation or 'linear'}{'' if self.bias else '_nobias'}"

    @property
    def summary(self) -> str:
        call = f"{self.activation}({self.name}(x))" if self.activation else f"{self.name}(x)"
        return (f"{call}, {self.name} = Linear({self.in_features} -> {self.out_features}"
                f"{'' if self.bias else ', no bias'})")


def _dotted(node: ast.expr) -> str:
    """`torch.ops.aten.relu.default` for a callee written so; "" for anything else."""
    return ast.unparse(node) if isinstance(node, (ast.Name, ast.Attribute)) else ""


def _under_self(node: ast.expr) -> str | None:
    """The dotted name `self.a.b` or `getattr(self.a, "0")` reads ("" for self), else None."""
    if isinstance(node, ast.Name):
        return "" if node.id == "self" else None
    if isinstance(node, ast.Attribute):
        step, base = node.attr, _under_self(node.value)
    elif (isinstance(node, ast.Call) and _dotted(node.func) == "getattr" and len(node.args) == 2
          and not node.keywords and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        step, base = node.args[1].value, _under_self(node.args[0])
    else:
        return None
    return None if base is None else f"{base}.{step}".lstrip(".")


def _brief(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 90 else text[:87] + "..."


def _constant(node: ast.expr, what: str) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise PartRefused(f"{what} is not a literal: {_brief(node)}") from None


def _float32_only(node: ast.AST, what: str) -> None:
    """Refuses a dtype other than float32 named anywhere in `node` (the core computes float32)."""
    for kw in (k for n in ast.walk(node) if isinstance(n, ast.Call) for k in n.keywords):
        if kw.arg in ("dtype", "device") and not (kw.arg == "dtype" and ast.unparse(kw.value) == "torch.float32"):
            raise PartRefused(f"{what} names {kw.arg}={ast.unparse(kw.value)}: the fp32 core serves float32 "
                              "tensors on the candidate's device")


def _places(init: ast.FunctionDef) -> list[tuple[str, ast.expr, ast.stmt]]:
    """The constructor's `_place(self, name, value)` lines in order; refuses a constructor doing more."""
    places = []
    for stmt in init.body:
        if ast.unparse(stmt) == "super().__init__()":
            continue
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        if (call is None or _dotted(call.func) != "_place" or len(call.args) != 3
                or not isinstance(call.args[1], ast.Constant) or not isinstance(call.args[1].value, str)):
            raise PartRefused(f"its constructor does more than place modules and parameters: {_brief(stmt)}")
        places.append((call.args[1].value, call.args[2], stmt))
    return places


def _activation_module(value: ast.expr) -> str | None:
    """The ACTIVATIONS key of a placed module computing one (with neutral arguments), else None."""
    if not isinstance(value, ast.Call):
        return None
    for key, act in ACTIVATIONS.items():
        if _dotted(value.func) in act.modules and not value.args and all(
                kw.arg in _NEUTRAL and _constant(kw.value, kw.arg) in _NEUTRAL[kw.arg] for kw in value.keywords):
            return key
    return None


def _linear_module(value: ast.Call) -> tuple[int, int, bool]:
    """(in, out, bias) of a placed `nn.Linear(...)`."""
    _float32_only(value, "its Linear")
    given = dict(zip(("in_features", "out_features", "bias"), value.args))
    given.update({kw.arg: kw.value for kw in value.keywords if kw.arg})
    if set(given) - {"in_features", "out_features", "bias"} or len(value.args) > 3:
        raise PartRefused(f"its Linear takes arguments the generator does not know: {_brief(value)}")
    k, n = (_constant(given[w], w) if w in given else None for w in ("in_features", "out_features"))
    bias = _constant(given["bias"], "bias") if "bias" in given else True
    if not isinstance(k, int) or not isinstance(n, int) or not isinstance(bias, bool):
        raise PartRefused(f"its Linear's sizes are not literal integers: {_brief(value)}")
    return k, n, bias


def _parameter_shape(value: ast.expr, name: str) -> list[int]:
    """The shape of a placed `nn.Parameter(torch.randn([O, I], ...) * 0.02)`: its first literal list."""
    _float32_only(value, name)
    for node in ast.walk(value):
        if isinstance(node, (ast.List, ast.Tuple)):
            shape = _constant(node, name)
            if isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape):
                return list(shape)
    raise PartRefused(f"the shape of {name} is not a literal: {_brief(value)}")


def _the_linear(places: list[tuple[str, ast.expr, ast.stmt]]) -> tuple[str, int, int, bool, list[ast.stmt]]:
    """(name, in, out, bias, the lines making its parameters) of the one Linear the part places: an
    nn.Linear (fx trace) or its weight and bias as parameters (export trace). Activation modules may
    stand beside it; anything else is refused."""
    modules = [(n, v, s) for n, v, s in places if isinstance(v, ast.Call)
               and _dotted(v.func) in ("nn.Linear", "torch.nn.Linear")]
    params = [(n, v, s) for n, v, s in places if isinstance(v, ast.Call)
              and _dotted(v.func) in ("nn.Parameter", "torch.nn.Parameter")]
    for name, value, _ in places:
        if not any(name == n for n, _, _ in modules + params) and _activation_module(value) is None \
                and not (isinstance(value, ast.Call) and _dotted(value.func) in DROPOUTS):
            raise PartRefused(f"it holds {name} ({_brief(value)}), not only a Linear and a pointwise op "
                              f"the generator writes ({', '.join(ACTIVATIONS)})")
    if len(modules) == 1:
        name, value, stmt = modules[0]
        if params:
            raise PartRefused(f"it holds {', '.join(n for n, _, _ in params)} beside its Linear {name}")
        assert isinstance(value, ast.Call)
        return (name, *_linear_module(value), [stmt])
    owners = {n.rsplit(".", 1)[0] for n, _, _ in params}
    leaves = {n.rsplit(".", 1)[-1]: (v, s) for n, v, s in params}
    if modules or len(owners) != 1 or not {"weight"} <= set(leaves) <= {"weight", "bias"}:
        held = ", ".join(sorted({n.rsplit(".", 1)[0] for n, _, _ in params} | {n for n, _, _ in modules}))
        raise PartRefused(f"it holds the parameters of {held or 'nothing'}, not of one Linear")
    (owner,) = owners
    weight = _parameter_shape(leaves["weight"][0], f"{owner}.weight")
    if len(weight) != 2 or ("bias" in leaves and _parameter_shape(leaves["bias"][0], f"{owner}.bias") != weight[:1]):
        raise PartRefused(f"{owner}'s parameters are not a Linear's (weight {weight})")
    return owner, weight[1], weight[0], "bias" in leaves, [s for _, _, s in params]


def _is_dropout_identity(call: ast.Call) -> bool:
    """A dropout call that drops nothing: p 0, or not training (`aten.dropout(x, p, train)`)."""
    if _dotted(call.func) not in DROPOUTS:
        return False
    given = dict(zip(("input", "p", "train"), call.args))
    given.update({("train" if kw.arg == "training" else kw.arg or ""): kw.value for kw in call.keywords})
    p = _constant(given["p"], "dropout's p") if "p" in given else 0.5
    train = _constant(given["train"], "dropout's training") if "train" in given else True
    return p == 0 or train is False


def _epilogue_of(forward: ast.FunctionDef, linear: str, bias: bool, activations: dict[str, str]) -> str:
    """The activation the forward applies to the Linear of its one input ("" for none). The forward is
    followed name by name; it must compute activation(linear(input)) and nothing the kernel does not."""
    inputs = [a.arg for a in forward.args.args[1:]]
    if len(inputs) != 1 or forward.args.vararg or forward.args.kwonlyargs or forward.args.kwarg:
        raise PartRefused(f"its forward takes {len(inputs)} inputs; the kernel takes one")
    values: dict[str, tuple[str, ...]] = {inputs[0]: ("input",)}

    def operand(node: ast.expr) -> tuple[str, ...]:
        if isinstance(node, ast.Name) and node.id in values:
            return values[node.id]
        raise PartRefused(f"its forward computes with {_brief(node)}")

    def value_of(node: ast.expr) -> tuple[str, ...]:
        dotted = _under_self(node)
        if dotted is not None:
            return ("ref", dotted)
        if not isinstance(node, ast.Call):
            raise PartRefused(f"its forward does more than a Linear and a pointwise op: {_brief(node)}")
        callee, name = _under_self(node.func), _dotted(node.func)
        extra = [kw for kw in node.keywords if not (kw.arg in _NEUTRAL and _constant(kw.value, kw.arg)
                                                    in _NEUTRAL[kw.arg])]
        if callee == linear and len(node.args) == 1 and not node.keywords:
            return ("linear", *operand(node.args[0]))
        if callee in activations and len(node.args) == 1 and not node.keywords:
            return ("act", activations[callee], *operand(node.args[0]))
        if name in LINEAR_CALLS and len(node.args) == (3 if bias else 2) and not node.keywords:
            wanted = [("ref", f"{linear}.weight")] + ([("ref", f"{linear}.bias")] if bias else [])
            if [operand(a) for a in node.args[1:]] == wanted:
                return ("linear", *operand(node.args[0]))
        for key, act in ACTIVATIONS.items():
            if name in act.functions and len(node.args) == 1 and not extra:
                return ("act", key, *operand(node.args[0]))
        if node.args and _is_dropout_identity(node):
            return operand(node.args[0])
        raise PartRefused(f"its forward does more than a Linear and a pointwise op the generator writes: "
                          f"{_brief(node)}")

    for stmt in forward.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and stmt.value.value is None:
            continue  # `a = b = None`: the tracer's freeing of names
        if isinstance(stmt, ast.Return) and stmt.value is not None:
            out = operand(stmt.value)
            if out == ("linear", "input"):
                return ""
            if len(out) == 4 and out[0] == "act" and out[2:] == ("linear", "input"):
                return out[1]
            raise PartRefused("its output is not a pointwise op of the Linear of its input")
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            raise PartRefused(f"its forward does more than a Linear and a pointwise op: {_brief(stmt)}")
        values[stmt.targets[0].id] = value_of(stmt.value)
    raise PartRefused("its forward returns nothing")


def linear_part(source: str, problem: str, part: str) -> LinearPart:
    """Reads a part file (its syntax tree only); raises PartRefused for a part the core cannot serve."""
    tree = ast.parse(source)
    top = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    model, place = top.get("Model"), top.get("_place")
    if not isinstance(model, ast.ClassDef) or not isinstance(place, ast.FunctionDef):
        raise PartRefused("it is not a part file of `kb-mcp decompose` (no Model, or no _place helper)")
    methods = {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}
    if set(methods) != {"__init__", "forward"}:
        raise PartRefused(f"its Model defines {', '.join(sorted(methods))}; a part defines __init__ and forward")
    places = _places(methods["__init__"])
    try:
        name, k, n, bias, makes = _the_linear(places)
    except PartRefused as exc:
        # an export trace places parameters only: the ops its forward calls say what the part is
        ops = sorted({_dotted(c.func).split(".")[-2] for c in ast.walk(methods["forward"]) if isinstance(c, ast.Call)
                      and _dotted(c.func).startswith("torch.ops.aten.")})
        raise PartRefused(f"{exc} (its forward calls {', '.join(ops)})" if ops else str(exc)) from None
    if k % 4:
        raise PartRefused(f"{name} has {k} input features: the core reads rows as float4, K must be a multiple of 4")
    inputs = top.get("get_inputs")
    if inputs is not None:
        _float32_only(inputs, "its get_inputs")
    activations = {pn: key for pn, v, _ in places if (key := _activation_module(v)) is not None}
    activation = _epilogue_of(methods["forward"], name, bias, activations)
    lines = tuple(ast.get_source_segment(source, s) or "" for s in makes)
    return LinearPart(problem, part, name, k, n, bias, activation, lines, ast.get_source_segment(source, place) or "")


_PART_FILE = (_HEAD + '"""Candidate for {part} of {problem}: {summary}.\n\n' + _METHOD + """
The Linear keeps its name in the model, and its parameters are made by the part's own lines, in its
order: the model's state dict loads into it by name, and the same seed gives the same values.
Leading input dims are flattened into rows and shaped back. The extension is built by the first
forward, not at import: the module builds, and its state dict reads, without a GPU.
Linear: {name}

Generated by bench/tc_fp32_sync.py (--part) from bench/tc_fp32/gemm_core.cu and the part's file.
\"\"\"

""" + _SOURCES + '''
_BUILT: dict[str, object] = {{}}


def _ext():
    """The extension, built (or found in torch's cache) by the first call."""
    if not _BUILT:
        _BUILT["ext"] = ''' + _LOAD.replace("\n", "\n        ") + '''
    return _BUILT["ext"]


{place}


class ModelNew(nn.Module):
    """{summary}"""

    def __init__(self) -> None:
        super().__init__()
        # the part's own lines: its names and shapes, and in its order, so the same seed gives the same values
{makes}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = {layer}
        rows = x.reshape(-1, x.shape[-1])  # the kernel multiplies 2-D operands
        y = _ext().gemm3x(rows, layer.weight{bias_arg}, 0.0, 0.0, 0.0,
                          torch.cuda.current_stream(x.device).cuda_stream)
        return y.reshape(*x.shape[:-1], y.shape[-1])
''')


def _path_expr(dotted: str) -> str:
    """Python reading the module at `dotted` under self: self.i2h, getattr(self.network, "0")."""
    expr = "self"
    for step in dotted.split("."):
        expr = f"{expr}.{step}" if step.isidentifier() and not keyword.iskeyword(step) else f'getattr({expr}, "{step}")'
    return expr


def _part_note(part: LinearPart) -> str:
    steps = [w for w, on in (("adds the bias", part.bias), (f"applies {part.activation}", part.activation)) if on]
    return (f"The epilogue {' and '.join(steps)} to the accumulators before the only store." if steps
            else _epilogue_note(False))


def render_part(part: LinearPart) -> str:
    """The candidate file for a Linear part: the core (B N x K, the weight as it lies), the bias and the
    activation as its epilogue, and a ModelNew holding the Linear at the part's name."""
    value = "v + __ldg(e.bias + col)" if part.bias else "v"
    epilogue = f"const float x = {value};\n    return {ACTIVATIONS[part.activation].cuda if part.activation else 'x'};"
    return _PART_FILE.format(
        part=part.part, problem=part.problem, summary=part.summary, name=part.name, orientation=_orientation(False),
        epilogue_note=_part_note(part),
        ext=part.ext_name, cpp=render_cpp(False, part.bias, False), variant_mark=VARIANT_MARK, b_kn_int=0,
        core=render_cuda(epilogue), place=part.place, makes="\n".join(f"        {line}" for line in part.makes),
        layer=_path_expr(part.name), bias_arg=", layer.bias" if part.bias else "")


def part_candidate(part_file: Path, problem: str = "") -> str:
    """The candidate for the part file `part_file` (of a `kb-mcp decompose` folder); PartRefused where
    the core cannot serve it. `problem` defaults to the name the folder's decomposition.json gives."""
    if not problem:
        manifest = part_file.parent.parent / "decomposition.json"
        problem = json.loads(manifest.read_text())["problem"] if manifest.is_file() else part_file.parent.parent.name
    return render_part(linear_part(part_file.read_text(), problem, part_file.stem))


