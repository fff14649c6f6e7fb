"""A problem's model decomposed: traced in the sandbox, grouped into parts, ranked, each part written
as a problem file of its own, and the reference recomposed from them (`composed_reference.py`)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any, Literal

from kb_mcp.decomposition import grouping, ranking, runner, writing
from kb_mcp.decomposition.compose import PartSource, composed_source
from kb_mcp.decomposition.errors import DecompositionError, PastTimeLimit, TracerLimit
from kb_mcp.decomposition.limits import TIME_LIMIT_S
from kb_mcp.decomposition.models import Decomposition, Part, Trace
from kb_mcp.harness.sandbox.sandbox import Sandbox

MANIFEST = "decomposition.json"
REFERENCE = "composed_reference.py"
PROBLEM = "problem.py"  # the model's own source, kept beside its parts (so a folder names the problem it is of)
COMPOSED = "composed.py"  # the whole-model candidate composed from the parts (`assemble.write_composed`)
_WRITTEN = re.compile(r"(problem|composed|composed_reference)\.py|decomposition\.json|parts(/part\d+\.py)?")
"""The paths, relative to a decomposition's folder, that writing a decomposition or composing it writes."""
WHOLE_GLUE = "def forward(self, *args):\n    return self.submod_0(*args)\n"


def failed(step: str, problem: str, answer: dict[str, Any]) -> DecompositionError:
    """The error for a worker's failed answer at `step` ("tracing", "splitting")."""
    message = f"{step} {problem} failed: {answer.get('error')}"
    limit = answer.get("timed_out")
    return PastTimeLimit(message, float(limit)) if isinstance(limit, (int, float)) else DecompositionError(message)


def enters_autocast(source: str) -> bool:
    """Whether the problem's code enters an autocast region (`with torch.autocast(...)`, a decorator, the
    `torch.cuda.amp` / `torch.cpu.amp` forms): a dtype rule that lives outside the graph a trace records."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    calls = [item.context_expr for node in ast.walk(tree) if isinstance(node, (ast.With, ast.AsyncWith))
             for item in node.items]
    calls += [d for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
              for d in node.decorator_list]
    return any(_called_name(c) == "autocast" for c in calls)


def _called_name(expr: ast.expr) -> str:
    """The last name of what an expression calls (`torch.amp.autocast(...)` -> autocast), or of the expression."""
    target = expr.func if isinstance(expr, ast.Call) else expr
    return target.attr if isinstance(target, ast.Attribute) else target.id if isinstance(target, ast.Name) else ""


def _parts(problem: str, trace: Trace) -> tuple[list[Part], dict[str, int]]:
    if trace.method == "whole":
        whole = Part(index=1, name="part01", kind="whole", label="the whole model", nodes=[], flops=trace.flops,
                     bytes=trace.bytes, file="parts/part01.py")
        return ranking.rank_estimated([whole]), {}
    groups = grouping.group(trace)
    parts = [Part(index=i, name=f"part{i:02d}", kind=grouping.part_kind(g), label=grouping.label(g),
                  nodes=[n.name for n in g.nodes], modules=[n.target for n in g.nodes if n.op == "call_module"],
                  flops=sum(n.flops for n in g.nodes), bytes=sum(n.bytes for n in g.nodes),
                  file=f"parts/part{i:02d}.py") for i, g in enumerate(groups, 1)]
    return ranking.rank_estimated(parts), grouping.assignment(groups)


Shrink = frozenset[str] | Literal["auto"]
Planned = tuple[Decomposition, dict[str, int]]
Decomposed = tuple[Decomposition, dict[str, str]]


def plan(problem: str, source: str, traced: dict[str, Any], batch: int | None = None) -> Planned:
    """The decomposition of a traced model (the worker's trace answer), before the split."""
    if not traced.get("ok"):
        raise failed("tracing", problem, traced)
    trace = Trace.model_validate({k: v for k, v in traced.items() if k not in ("ok", "shrunk")})
    if trace.method != "whole" and enters_autocast(source):
        raise TracerLimit(
            f"{problem} enters autocast (`torch.autocast`, `torch.cuda.amp.autocast`), which a traced graph does not "
            "keep: traced on meta tensors, the ops inside it would be written into parts at the dtypes outside it, "
            "so the parts would not compute what the model computes. This is a limit of kb-mcp's trace, not a fault "
            "of the model", action="to decompose the model now, cast explicitly where autocast would "
            "(`self.fc1(x.to(torch.bfloat16))` with the layer in bfloat16), or decompose it without the autocast "
            "region")
    parts, assignment = _parts(problem, trace)
    shrunk = bool(traced.get("shrunk"))
    sizes = "its sizes divided for a check" if shrunk else "the real sizes"
    notes = [f"{trace.method}: traced at {sizes} on {trace.built_on} tensors"
             + (f" with batch {batch}" if batch else "")]
    return Decomposition(problem=problem, method=trace.method, built_on=trace.built_on, failures=trace.failures,
                         parts=parts, batch=batch, shrunk=shrunk, notes=notes), assignment


def finish(decomp: Decomposition, source: str, split: dict[str, Any] | None) -> dict[str, str]:
    """The files of a decomposition (relative path -> text): each part, the recomposed reference, the manifest."""
    files: dict[str, str] = {}
    if decomp.method == "whole" or split is None:
        files["parts/part01.py"] = source
        decomp.glue = WHOLE_GLUE
    else:
        if not split.get("ok"):
            raise failed("splitting", decomp.problem, split)
        decomp.glue = split["glue"]
        files.update(_part_files(decomp, split["parts"]))
    refs = [PartSource(name=p.name, source=files[p.file], class_name="Model", note=f"{p.label}: the reference part")
            for p in decomp.parts]
    files[REFERENCE] = composed_source(decomp.problem, refs, decomp.glue)
    files[MANIFEST] = decomp.model_dump_json(indent=1)
    return files


def _part_files(decomp: Decomposition, pieces: list[dict[str, Any]]) -> dict[str, str]:
    """Each part's problem file. Parts that compute the same on the same tensors (their files equal but
    for the docstring) share the first one's file: `same_as` names it, and its docstring lists them."""
    total = len(decomp.parts)
    first: dict[str, Part] = {}
    for part, piece in zip(decomp.parts, pieces):
        part.parameters = [f"{m}.{k}" for m, info in piece["modules"].items() for k in info["keys"]] + \
            list(piece["tensors"])
        found = first.setdefault(writing.computation(writing.part_source(decomp.problem, part, piece, total)), part)
        if found is not part:
            part.file, part.same_as = found.file, found.name
    return {part.file: writing.part_source(decomp.problem, part, piece, total,
                                           tuple(p.index for p in decomp.parts if p.same_as == part.name))
            for part, piece in zip(decomp.parts, pieces) if part.same_as is None}


def decompose_many(problems: list[tuple[str, str]], sandbox: Sandbox | None = None, batch: int | None = None,
                   jobs: int = 1, shrink: Shrink = frozenset(),
                   timeout_s: float = TIME_LIMIT_S) -> list[Decomposed | DecompositionError]:
    """Several problems (name, source) decomposed together: a decomposition and its files, or the error
    (`PastTimeLimit` where a problem's code ran past `timeout_s`, its limit in each step). `batch` reduces
    the problems' batch size, `shrink` names problems whose sizes are divided too, or is "auto" (those
    whose parameters would take long to build for real, where the sizes divide): both for checks on a
    small machine; a decomposition to work from uses neither."""
    extra = {"batch": batch} if batch else {}
    entries: list[dict[str, Any]] = [{"source": s, **extra, "shrink": shrink if shrink == "auto" else name in shrink}
                                     for name, s in problems]
    traced = runner.run("trace", entries, sandbox, timeout_s, jobs=jobs)
    for entry, t in zip(entries, traced):  # the split and the check use the sizes the trace chose
        entry["shrink"] = bool(t.get("shrunk"))
    plans: list[Planned | DecompositionError] = []
    for (name, source), t in zip(problems, traced):
        try:
            plans.append(plan(name, source, t, batch))
        except DecompositionError as exc:
            plans.append(exc)
    todo = [i for i, p in enumerate(plans) if not isinstance(p, DecompositionError) and p[0].method != "whole"]
    costs = [float(len(traced[i].get("nodes") or [])) for i in todo]  # splitting a graph takes its size's time
    splits = runner.run("split", [{**entries[i], "assignment": plans[i][1]}  # type: ignore[index]
                                  for i in todo], sandbox, timeout_s, jobs=jobs, costs=costs) if todo else []
    by_index = dict(zip(todo, splits))
    out: list[Decomposed | DecompositionError] = []
    for i, p in enumerate(plans):
        if isinstance(p, DecompositionError):
            out.append(p)
            continue
        try:
            out.append((p[0], finish(p[0], problems[i][1], by_index.get(i))))
        except DecompositionError as exc:
            out.append(exc)
        except (ValueError, SyntaxError) as exc:
            out.append(DecompositionError(str(exc)))
    return out


def foreign_entries(out_dir: Path) -> list[str]:
    """What in `out_dir` a decomposition does not write: other names, links, special files (none when
    `out_dir` does not exist). Links are not followed: a folder holding one is not a decomposition's."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return []
    if out_dir.is_symlink() or not out_dir.is_dir():
        return ["."]
    foreign = []
    for path in sorted(out_dir.rglob("*")):  # rglob does not descend into linked folders
        rel = path.relative_to(out_dir).as_posix()
        plain = path.is_dir() if rel == "parts" else path.is_file()
        if path.is_symlink() or not plain or not _WRITTEN.fullmatch(rel):
            foreign.append(rel)
    return foreign


def holds_another_problem(out_dir: Path, source: str) -> bool:
    """True when `out_dir` holds the decomposition of a model other than `source` (another problem, or
    another version of this one): its kept problem file differs."""
    kept = out_dir / PROBLEM
    return kept.is_file() and kept.read_text(errors="replace") != source


def write(files: dict[str, str], out_dir: Path) -> None:
    """Writes a decomposition's files under `out_dir`."""
    for rel, text in files.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def load(out_dir: Path) -> Decomposition:
    """A decomposition written earlier (its manifest)."""
    return Decomposition.model_validate(json.loads((out_dir / MANIFEST).read_text()))
