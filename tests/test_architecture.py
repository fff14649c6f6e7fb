"""The import rules of docs/architecture.md, checked: which part may import which (the table there is
the rule; a part is a package, or one of the harness's sub-packages), no cycle between parts or between
modules, no part of the harness over its size, and no module-level torch import outside harness/."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("kb", "policy", "harness", "profiling", "decomposition", "tools", "clients", "campaign", "server")
# The harness's sub-packages with a row of their own (`harness/judgment/static/` is part of `judgment`).
HARNESS_PARTS = (
    "harness.sandbox", "harness.gpu", "harness.judgment", "harness.builds", "harness.pool", "harness.worker",
)
PARTS = PACKAGES + HARNESS_PARTS
MAX_MODULES = 15  # modules in the harness's top level, each of its parts but worker/, and profiling/

# Module cycles known and owned elsewhere (none now). Any other cycle fails.
KNOWN_CYCLES: list[frozenset[str]] = []


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. kb_mcp.tools.lane
    target: str  # what it imports, e.g. kb_mcp.kb.progress
    line: int
    top_level: bool  # runs when the module is imported (not inside a function or TYPE_CHECKING)


def rules() -> dict[str, set[str]]:
    """The table under '### Import rules': part -> what it may import."""
    text = DOC.read_text()
    start = text.index("### Import rules")
    section = text[start : text.index("\n\n", text.index("| package |", start))]
    table: dict[str, set[str]] = {}
    for row in re.finditer(r"^\| `([\w.]+)` \| (.+) \|$", section, re.M):
        table[row.group(1)] = set(re.findall(r"`([\w.]+)`", row.group(2)))
    return table


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found["kb_mcp." + ".".join(parts)] = path
    return found


def imports_of(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    deferred: set[int] = set()
    for node in ast.walk(tree):
        guarded = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        if guarded or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            deferred |= {id(inner) for inner in ast.walk(node) if inner is not node}
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        top = id(node) not in deferred
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno, top)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:  # `from kb_mcp.kb import matching` imports kb_mcp.kb.matching
                yield Import(module, f"{base}.{alias.name}", node.lineno, top)


def all_imports() -> list[Import]:
    return [imp for module, path in modules().items() for imp in imports_of(module, path)]


def part_of(name: str) -> str:
    """The part a module (or a name inside one) belongs to: the longest part its dotted name starts with
    (`kb_mcp.harness.gpu.lane.hold` -> `harness.gpu`, `kb_mcp.harness.problem` -> `harness`)."""
    inner = name.removeprefix("kb_mcp.")
    found = [part for part in PARTS if inner == part or inner.startswith(part + ".")]
    return max(found, key=len) if found else inner.split(".")[0]


def _entry_part(entry: str) -> str:
    """The part a table entry names: the entry itself where it is a part, else the part of its module."""
    return entry if entry in PARTS else part_of(entry)


def _allowed(part: str, target: str, table: dict[str, set[str]]) -> bool:
    """An entry naming a part allows that part's modules (not those of its own sub-parts); an entry
    naming a module allows that module."""
    parts = target.split(".")
    if parts[0] != "kb_mcp" or len(parts) < 2 or part_of(target) == part:
        return True
    inner = ".".join(parts[1:])
    return any(
        part_of(target) == entry if entry in PARTS else inner == entry or inner.startswith(entry + ".")
        for entry in table[part]
    )


def test_the_table_names_every_part_and_only_parts() -> None:
    table = rules()
    assert set(table) == set(PARTS), f"docs/architecture.md's import table lists {sorted(table)}"
    known = modules()
    for part, entries in table.items():
        for entry in entries:
            assert entry in PARTS or f"kb_mcp.{entry}" in known, f"{part}: {entry} is neither a part nor a module"


def test_every_harness_sub_package_is_a_part_or_inside_one() -> None:
    folders = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "harness").rglob("__init__.py")}
    assert {"harness", *HARNESS_PARTS} <= folders
    assert all(part_of(folder) in ("harness", *HARNESS_PARTS) for folder in folders)
    direct = {folder for folder in folders if folder.count(".") == 1}
    assert direct == set(HARNESS_PARTS), f"give these a row in docs/architecture.md's table: {sorted(direct)}"


def test_no_part_of_the_harness_nor_profiling_holds_more_than_its_share_of_modules() -> None:
    """A folder a reader can take in at a glance: `harness/`'s own modules, each of its parts but the
    worker side, and `profiling/` hold at most MAX_MODULES modules each (not counting `__init__.py`)."""
    counted = ["harness", "profiling", *(part for part in HARNESS_PARTS if part != "harness.worker")]
    sizes = {folder: len([p for p in (ROOT / folder.replace(".", "/")).glob("*.py") if p.name != "__init__.py"])
             for folder in counted}
    assert all(size > 0 for size in sizes.values()), sizes
    assert max(sizes.values()) <= MAX_MODULES, sizes


def test_every_import_is_one_the_table_allows() -> None:
    table = rules()
    bad = [
        f"{imp.module} (line {imp.line}) imports {imp.target}"
        for imp in all_imports()
        if not _allowed(part_of(imp.module), imp.target, table)
    ]
    assert not bad, "imports docs/architecture.md (Import rules) does not allow:\n" + "\n".join(sorted(set(bad)))


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def drawn_arrows() -> set[tuple[str, str]]:
    """The paragraph under the drawing that starts 'The arrows:': `a → b` pairs."""
    text = DOC.read_text()
    start = text.index("The arrows:")
    paragraph = text[start : text.index("\n\n", start)]
    return {(m.group(1), m.group(2)) for m in re.finditer(r"`([\w.]+) → ([\w.]+)`", paragraph)}


def _reach(arrows: set[tuple[str, str]], package: str) -> set[str]:
    found: set[str] = set()
    todo = [package]
    while todo:
        node = todo.pop()
        for a, b in arrows:
            if a == node and b not in found:
                found.add(b)
                todo.append(b)
    return found


def test_the_drawing_is_the_table() -> None:
    """Every part reaches, along the drawing's arrows, exactly the parts its row of the table names; a row
    narrowed to single modules (`policy`, `harness.worker`) names only parts the drawing reaches."""
    arrows = drawn_arrows()
    assert arrows and {p for arrow in arrows for p in arrow} <= set(PARTS)
    table = rules()
    for part in PARTS:
        named = {_entry_part(entry) for entry in table[part]}
        reach = _reach(arrows, part)
        if all(entry in PARTS for entry in table[part]):
            assert reach == named, f"{part}: the drawing reaches {sorted(reach)}"
        else:
            assert named <= reach, f"{part}: the drawing reaches {sorted(reach)}, not {sorted(named - reach)}"


def test_the_allowed_part_graph_has_no_cycle() -> None:
    """The harness's parts and the packages are layers: none reaches back up to itself."""
    table = rules()
    graph = {part: {_entry_part(entry) for entry in entries} - {part} for part, entries in table.items()}
    assert _cycles(graph) == []


def test_the_imports_between_parts_have_no_cycle() -> None:
    """What the code imports, folded by part (lazy imports count too), has no cycle either."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for imp in all_imports():
        target = _module_of(imp.target, known)
        if target is not None and part_of(target) != part_of(imp.module):
            graph.setdefault(part_of(imp.module), set()).add(part_of(target))
    assert _cycles(graph) == []


def _module_of(target: str, known: dict[str, Path]) -> str | None:
    """The module of ours an import loads (`kb_mcp.kb.models.Score` -> `kb_mcp.kb.models`)."""
    parts = target.split(".")
    while parts:
        name = ".".join(parts)
        if name in known:
            return name
        parts.pop()
    return None


def test_no_import_cycle_between_modules() -> None:
    known = modules()
    graph: dict[str, set[str]] = {}
    for imp in all_imports():
        target = _module_of(imp.target, known)
        if target is not None and target != imp.module:
            graph.setdefault(imp.module, set()).add(target)
    unexpected = [sorted(c) for c in _cycles(graph) if c not in KNOWN_CYCLES]
    assert not unexpected, f"import cycles (lazy imports count too): {unexpected}"


def test_no_module_level_torch_outside_the_harness() -> None:
    bad = [
        f"{imp.module} (line {imp.line})"
        for imp in all_imports()
        if imp.top_level and imp.target.split(".")[0] == "torch" and not imp.module.startswith("kb_mcp.harness.")
    ]
    assert not bad, f"torch imported at module level: {bad}"


DASK = ("dask", "distributed")
DASK_EDGE = {"kb_mcp.campaign.cluster"}  # the only module that imports Dask (docs/architecture.md)


def test_dask_only_at_the_cluster_edge() -> None:
    """The single-GPU path never pays for Dask: only the cluster's edge module imports it."""
    bad = [
        f"{imp.module} (line {imp.line})"
        for imp in all_imports()
        if imp.target.split(".")[0] in DASK and imp.module not in DASK_EDGE
    ]
    assert not bad, f"Dask imported outside {sorted(DASK_EDGE)}: {bad}"
    assert any(imp.target.split(".")[0] in DASK for m in DASK_EDGE for imp in imports_of(m, modules()[m]))


def test_the_checks_can_fail() -> None:
    """The rules reject what they should (guards against a parser that finds nothing)."""
    table = rules()
    assert not _allowed("kb", "kb_mcp.tools.context", table)
    assert not _allowed("policy", "kb_mcp.kb.store", table)
    assert not _allowed("tools", "kb_mcp.campaign.loop", table)
    assert _allowed("policy", "kb_mcp.harness.profile_model", table)
    assert not _allowed("policy", "kb_mcp.harness.protocol", table)
    assert not _allowed("harness", "kb_mcp.harness.pool.pool.WorkerPool", table)
    assert not _allowed("profiling", "kb_mcp.harness.builds.builds", table)
    assert not _allowed("harness.gpu", "kb_mcp.harness.sandbox.sandbox", table)
    assert _allowed("harness.worker", "kb_mcp.harness.builds.toolchain", table)
    assert not _allowed("harness.worker", "kb_mcp.harness.builds.builds", table)
    assert _allowed("harness.pool", "kb_mcp.profiling.work", table)
    assert part_of("kb_mcp.harness.judgment.static.cpp") == "harness.judgment"
    assert part_of("kb_mcp.harness.problem.Problem") == "harness"
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [frozenset({"a", "b"})]
    assert _reach({("a", "b"), ("b", "c"), ("d", "a")}, "a") == {"b", "c"}
    lane = ROOT / "tools" / "lane.py"
    found = {(imp.target, imp.top_level) for imp in imports_of("kb_mcp.tools.lane", lane)}
    assert ("kb_mcp.kb.progress.Progress", True) in found
    assert len(all_imports()) > 500
