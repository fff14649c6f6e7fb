"""Composing a whole-model candidate from its parts' sources: each part's candidate (its `ModelNew`)
or the reference part (its `Model`), renamed so that parts do not collide, and a `ModelNew` that
calls them as the model does (the glue the split generated). The parts' modules and tensors are tied
to the composed model at the model's own names, so the model's state dict loads into it whole."""

from __future__ import annotations

import ast
import io
import re
import tokenize

from pydantic import BaseModel

FREE_NAMES = {"torch", "nn", "F", "math", "operator", "np", "base64", "zlib"}  # shared by every part, never renamed

TIE = '''

def _tie(root: nn.Module, part: nn.Module) -> None:
    """Registers a part's modules, parameters and buffers in the composed model at their own (the model's)
    names; where the composed model already holds one, the part is pointed at it. Called again after
    `.to()`/`.cuda()`, which replace buffers."""
    for name, p in part._parameters.items():
        if p is None:
            continue
        if name in root._parameters:
            part._parameters[name] = root._parameters[name]
        else:
            root.register_parameter(name, p)
    for name, b in part._buffers.items():
        if b is None:
            continue
        if name in root._buffers:
            part._buffers[name] = root._buffers[name]
        else:
            root.register_buffer(name, b, persistent=name not in part._non_persistent_buffers_set)
    for name, child in part._modules.items():
        mine = root._modules.get(name)
        if mine is None:
            root.add_module(name, child)
        elif mine is not child:
            _tie(mine, child)
'''


class PartSource(BaseModel):
    """One part as the composed candidate takes it: its source and the class to use from it."""

    name: str  # part01
    source: str
    class_name: str  # "ModelNew" for a candidate, "Model" for the reference part
    note: str  # what it is, for the file's comments: "candidate 1f2e... (faster, 2.1x)" / "the reference part"


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names - FREE_NAMES


def _dropped_lines(tree: ast.Module) -> set[int]:
    """Lines not carried into the composed file: the part's inputs, `__future__` imports, a main block."""
    lines: set[int] = set()
    for node in tree.body:
        drop = (isinstance(node, ast.FunctionDef) and node.name in ("get_inputs", "get_init_inputs")) or (
            isinstance(node, ast.ImportFrom) and node.module == "__future__") or (
            isinstance(node, ast.If) and "__name__" in ast.unparse(node.test))
        if drop:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            lines |= set(range(first, (node.end_lineno or node.lineno) + 1))
    return lines


def renamed(part: PartSource, class_as: str) -> str:
    """The part's source with its class named `class_as` and its other module-level names prefixed
    with the part's name (a token rewrite: comments and layout stay)."""
    tree = ast.parse(part.source)
    mapping = {n: f"{part.name}_{n}" for n in _defined(tree)}
    mapping[part.class_name] = class_as
    drop = _dropped_lines(tree)
    kept = "".join(line for i, line in enumerate(part.source.splitlines(keepends=True), 1) if i not in drop)
    out = []
    prev = None
    for tok in tokenize.generate_tokens(io.StringIO(kept).readline):
        if tok.type == tokenize.NAME and tok.string in mapping and not (prev and prev.string == "."):
            tok = tok._replace(string=mapping[tok.string])
        out.append(tok)
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            prev = tok
    return tokenize.untokenize(out)


def class_name(index: int) -> str:
    """The composed file's name for part `index` (1-based): Part01."""
    return f"Part{index:02d}"


def composed_source(problem: str, parts: list[PartSource], glue: str) -> str:
    """The whole-model candidate: the parts' code, then ModelNew calling them as the glue says."""
    own = sum(1 for p in parts if p.class_name == "ModelNew")
    head = (f'"""Composed candidate for {problem}: {len(parts)} parts, {own} of them own candidates, '
            f"the rest the reference's parts.\n\nWritten by `kb-mcp compose`; verified in composed mode "
            "(the candidate may keep the PyTorch ops the reference runs).\n")
    head += "".join(f"  {p.name}: {p.note}\n" for p in parts) + '"""\n\nimport torch\nimport torch.nn as nn\n'
    sections = [f"\n\n# ==== {p.name}: {p.note} ====\n\n{renamed(p, class_name(i))}"
                for i, p in enumerate(parts, 1)]
    forward = re.sub(r"self\.submod_(\d+)\(", lambda m: f"self.parts[{int(m.group(1))}](", glue.strip("\n"))
    calls = ", ".join(f"{class_name(i)}()" for i in range(1, len(parts) + 1))
    model = ("\n\nclass ModelNew(nn.Module):\n    def __init__(self, *init_inputs):\n        super().__init__()\n"
             "        # a plain list: the parts' modules are registered at the model's own names by _tie\n"
             f"        self.parts = [{calls}]\n        for part in self.parts:\n            _tie(self, part)\n\n"
             "    def _apply(self, fn, recurse=True):\n        super()._apply(fn, recurse)\n"
             "        for part in self.parts:\n            _tie(self, part)\n        return self\n\n"
             + "\n".join("    " + line if line.strip() else "" for line in forward.splitlines()) + "\n")
    return head + "".join(sections) + "\n\n# ==== composition ====" + TIE + model
