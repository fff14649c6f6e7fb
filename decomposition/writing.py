"""Writing a part as a KernelBench-format problem file (`Model`, `get_inputs`, `get_init_inputs`), from
the pieces the worker's split gives: the part's forward (fx's generated code), the torch.nn modules it
calls (rebuilt from their constructors, so a part reads like a level-1/2 problem), and the tensors it
reads. Every module and tensor sits at the model's own name (`layer1.0.conv1`), so the model's state
dict loads into the part, and into any candidate that keeps the part's names."""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from typing import Any

from kb_mcp.decomposition.errors import TracerLimit
from kb_mcp.decomposition.models import Part

# what fx's generated code names beyond `torch` (export's graphs name `device`)
GLOBAL_IMPORTS = {"device": "from torch import device", "inf": "from math import inf", "nan": "from math import nan",
                  "operator": "import operator", "math": "import math"}

HELPERS = '''

def _place(root: nn.Module, name: str, value) -> None:
    """Puts a module, parameter or buffer at its dotted name in the model, making the modules above it."""
    *path, leaf = name.split(".")
    for step in path:
        if not hasattr(root, step):
            root.add_module(step, nn.Module())
        root = getattr(root, step)
    if isinstance(value, nn.Module):
        root.add_module(leaf, value)
    elif isinstance(value, nn.Parameter):
        root.register_parameter(leaf, value)
    else:
        root.register_buffer(leaf, value)


def _values(text: str, shape: list, dtype: torch.dtype) -> torch.Tensor:
    """A buffer's values as the model holds them (zlib-compressed and base64-encoded)."""
    raw = bytearray(zlib.decompress(base64.b64decode(text)))
    return torch.frombuffer(raw, dtype=dtype).reshape(shape).clone()
'''


# The names the tracers give a tensor the forward computed while it was traced (fx's `_tensor_constant0`,
# export's `lifted_tensor_0`): the model holds no such attribute, so its state dict never fills one in.
TRACE_MADE = re.compile(r"_tensor_constant\d+|lifted_tensor_\d+")


def _tensor_line(part: str, name: str, piece: dict[str, Any]) -> str:
    shape, dtype = piece["shape"], f"torch.{piece['dtype']}"
    if not piece["parameter"] and "values" not in piece and TRACE_MADE.fullmatch(name):
        # zeros in its place would make a part that computes something else than the model, silently
        raise TracerLimit(
            f"{part} reads a tensor ({name}, shape {shape}, {dtype}) that the trace computed inside forward from the "
            "model's buffers or constants (as `torch.sqrt(self.running_var + eps)` or `~self.mask` do): traced on "
            "meta tensors its values are unknown, and the model's state dict does not hold it, so the part could "
            "not compute what the model computes. This is a limit of kb-mcp's trace, not a fault of the model",
            action="to decompose the model now, compute such a tensor once in __init__ and register it as a buffer of "
                   "its own (`self.register_buffer('inv_std', torch.rsqrt(self.running_var + 1e-5))`), and read "
                   "that buffer in forward")
    if piece["parameter"]:
        scale = "" if not dtype.startswith("torch.float") and "bfloat" not in dtype else " * 0.02"
        return f'_place(self, "{name}", nn.Parameter(torch.randn({shape}, dtype={dtype}){scale}))'
    if "values" in piece:
        return f'_place(self, "{name}", _values("{piece["values"]}", {shape}, {dtype}))'
    return f'_place(self, "{name}", torch.zeros({shape}, dtype={dtype}))  # values unknown here: loaded from the model'


def input_expr(summary: Any) -> str:
    """Python text that makes one input like `summary` (a tensor's shape and dtype, or a value)."""
    if isinstance(summary, list):
        return "[" + ", ".join(input_expr(s) for s in summary) + "]"
    if isinstance(summary, dict) and "shape" in summary:
        shape, dtype = summary["shape"], summary["dtype"]
        if dtype == "bool":
            return f"torch.rand({shape}) > 0.5"
        if dtype.startswith(("int", "uint")):
            return f"torch.randint(0, 8, {shape}, dtype=torch.{dtype})"
        return f"torch.randn({shape}, dtype=torch.{dtype})"
    if isinstance(summary, dict):
        return repr(summary.get("value"))
    return repr(summary)


def canonical_inputs(code: str) -> str:
    """The part's forward with its inputs named by position (`input_0`, ...) instead of after the values
    the model passes there (`cat_1`, `cat_2`): the same computation at two places of the model is then
    the same text. Left as it is where a position's name is already taken or the code does not parse."""
    try:
        forward = next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.FunctionDef))
    except (SyntaxError, StopIteration):
        return code
    args = [a.arg for a in forward.args.args[1:]]  # after self
    if forward.args.vararg or forward.args.kwarg or forward.args.kwonlyargs:
        return code
    rename = {old: f"input_{i}" for i, old in enumerate(args)}
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    taken = {t.string for t in tokens if t.type == tokenize.NAME} - set(rename)
    if taken & set(rename.values()):
        return code
    names = set(_variables(tokens))
    # untokenize keeps each token's place from its original position, so longer names stay spaced right
    return tokenize.untokenize(t._replace(string=rename.get(t.string, t.string)) if i in names else t
                               for i, t in enumerate(tokens))


def _variables(tokens: list[tokenize.TokenInfo]) -> list[int]:
    """The positions of the tokens that name a variable: not an attribute (`torch.ops.aten.view`) and
    not a call's keyword (`f(input=x)`), which share a variable's spelling but not its meaning."""
    out, depth = [], 0
    for i, t in enumerate(tokens):
        if t.type == tokenize.OP and t.string in "([{":
            depth += 1
        elif t.type == tokenize.OP and t.string in ")]}":
            depth -= 1
        if t.type != tokenize.NAME or (i and tokens[i - 1].string == "."):
            continue
        keyword = depth > 0 and i + 1 < len(tokens) and tokens[i + 1].string == "="
        if not keyword:
            out.append(i)
    return out


def computation(source: str) -> str:
    """What a part file computes, for telling whether two are the same: the file less its docstring,
    with the forward's own names (its inputs, the values fx named after their graph nodes, `mul` at one
    place and `mul_1` at the next) replaced by their order of appearance. Only compared, never written."""
    body = without_doc(source)
    try:
        tree = ast.parse(body)
        tokens = list(tokenize.generate_tokens(io.StringIO(body).readline))
    except (SyntaxError, tokenize.TokenError):
        return body
    local: set[str] = set()
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "forward"):
        local |= {a.arg for a in fn.args.args[1:]}
        local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    order: dict[str, str] = {}
    names = set(_variables(tokens))
    return " ".join(order.setdefault(t.string, f"_v{len(order)}") if i in names and t.string in local
                    else t.string for i, t in enumerate(tokens))


def without_doc(source: str) -> str:
    """A part file less its docstring (which names the part's place in the model): what it computes."""
    return source[source.index('"""', 3) + 3:] if source.startswith('"""') else source


def part_source(problem: str, part: Part, pieces: dict[str, Any], total: int, also: tuple[int, ...] = ()) -> str:
    """The part's problem file; `also`: the indices of the other parts that run the same file."""
    init = [f'_place(self, "{name}", {m["ctor"]})' for name, m in pieces["modules"].items() if m["ctor"]]
    unknown = [name for name, m in pieces["modules"].items() if not m["ctor"]]
    if unknown:
        raise ValueError(f"cannot rebuild the torch.nn modules {unknown} of {part.name} from their attributes")
    init += [_tensor_line(part.name, name, piece) for name, piece in pieces["tensors"].items()]
    imports = sorted({GLOBAL_IMPORTS[g] for g in pieces["globals"] if g in GLOBAL_IMPORTS})
    body = "\n".join(["super().__init__()", *init])
    names = ", ".join(part.modules[:6]) + (f" and {len(part.modules) - 6} more" if len(part.modules) > 6 else "")
    doc = (f'"""Part {part.index} of {total} of {problem}: {part.label} ({part.kind}).\n\n'
           f"Written by `kb-mcp decompose`. Its modules and tensors keep the model's names"
           f"{' (' + names + ')' if names else ''},\nso the model's own state dict loads into it. "
           f"{part.share_basis.capitalize()} share of the model's GPU time: {100 * part.share:.1f} %.\n"
           + _also(part, also) + '"""\n')
    inputs = ", ".join(input_expr(i.get("summary")) for i in pieces["inputs"])
    return (doc + "\nimport base64\nimport zlib\n\nimport torch\nimport torch.nn as nn\n"
            + "".join(f"{line}\n" for line in imports) + HELPERS + "\n\nclass Model(nn.Module):\n"
            + "    def __init__(self):\n" + textwrap.indent(body, " " * 8) + "\n"
            + textwrap.indent(canonical_inputs(pieces["code"]).strip("\n"), "    ") + "\n\n\n"
            + f"def get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return []\n")


def _also(part: Part, also: tuple[int, ...]) -> str:
    """The docstring's note on a file that several places of the model run."""
    if not also:
        return ""
    shown = ", ".join(str(i) for i in also[:8]) + (f" and {len(also) - 8} more" if len(also) > 8 else "")
    return (f"The model runs this same computation on the same tensors {len(also) + 1} times (part {part.index}, "
            f"and {shown}):\none file, so one verdict on it serves each of them.\n")
