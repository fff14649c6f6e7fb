"""Short modules and short functions: no module of the package folders over 500 lines, with no way
out; no module of bench/ over 600 lines and no function over 80, unless a `# long: <reason>` comment
says why (on a bench module's first lines, or on the def's signature). A reason is a sentence about the
code, not a promise to fix it later."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kb", "policy", "harness", "profiling", "decomposition", "tools", "clients", "campaign", "server")
FOLDERS = (*PACKAGES, "bench")
MAX_MODULE_LINES = 500  # a module of the package folders: no `# long:` lets one past it
MAX_BENCH_MODULE_LINES = 600  # a module of bench/: a `# long:` reason may let one past it
MAX_FUNCTION_LINES = 80
MODULE_HEAD_LINES = 5  # where a bench module's `# long:` comment goes
REASON = re.compile(r"#\s*long:\s*(?P<reason>.*)$")
NOT_A_REASON = re.compile(r"\b(todo|fixme|xxx|later|temporar\w*|for now|hack)\b", re.I)

# Files being split by their owners' changes in flight (issue #12). An entry that no longer exceeds
# the limit fails the test below, so the list only shrinks.
ALLOWANCE: set[str] = set()


@dataclass(frozen=True)
class Excess:
    key: str  # path, or path:function
    lines: int
    limit: int
    reason: str | None  # the `# long:` comment's reason, when there is one


def _reason(lines: list[str]) -> str | None:
    for line in lines:
        found = REASON.search(line)
        if found:
            return found.group("reason").strip()
    return None


def _signature_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> list[str]:
    """The def line and the rest of the signature (up to the body's first statement)."""
    return lines[node.lineno - 1 : max(node.lineno, node.body[0].lineno - 1)]


def is_package_module(rel: str) -> bool:
    """A module of the package folders (not bench/): its length has no `# long:` escape."""
    return rel.split("/")[0] in PACKAGES


def excesses_of(text: str, rel: str) -> list[Excess]:
    """The module `rel` (if over its limit) and each function over its limit, with the reasons given
    (a package module's reason is never read: nothing lets it past its limit)."""
    lines = text.splitlines()
    found = []
    package = is_package_module(rel)
    limit = MAX_MODULE_LINES if package else MAX_BENCH_MODULE_LINES
    if len(lines) > limit:
        found.append(Excess(rel, len(lines), limit, None if package else _reason(lines[:MODULE_HEAD_LINES])))
    for node in ast.walk(ast.parse(text, filename=rel)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                reason = _reason(_signature_lines(node, lines))
                found.append(Excess(f"{rel}:{node.name}", length, MAX_FUNCTION_LINES, reason))
    return found


def all_excesses() -> list[Excess]:
    return [
        e
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for e in excesses_of(path.read_text(), path.relative_to(ROOT).as_posix())
    ]


def is_real_reason(reason: str | None) -> bool:
    """At least a few words, and none that defer the work."""
    return reason is not None and len(reason.split()) >= 3 and not NOT_A_REASON.search(reason)


def test_no_long_module_or_function_without_a_reason() -> None:
    bad = [
        f"{e.key}: {e.lines} lines (limit {e.limit})" + (f"; not a reason: {e.reason!r}" if e.reason else "")
        for e in all_excesses()
        if e.key not in ALLOWANCE and not is_real_reason(e.reason)
    ]
    assert not bad, ("split these along their concerns (a bench module or a function may say why beside it "
                     "instead, `# long: <reason>`):\n" + "\n".join(bad))


def test_the_allowance_only_names_what_still_exceeds() -> None:
    over = {e.key for e in all_excesses()}
    stale = sorted(ALLOWANCE - over)
    assert not stale, f"within the limits now: remove from ALLOWANCE in tests/test_code_shape.py: {stale}"


def test_the_checks_can_fail() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    sample = (f"def long_one():\n{body}\n\n\ndef long_two():  # long: one table of cases, read top to bottom\n"
              f"{body}\n\n\ndef long_three():  # long: TODO split\n{body}\n\n\ndef short():\n    pass\n")
    found = {e.key.split(":")[1]: e for e in excesses_of(sample, "sample.py")}
    assert set(found) == {"long_one", "long_two", "long_three"}
    assert found["long_one"].lines == MAX_FUNCTION_LINES + 1 and found["long_one"].reason is None
    assert is_real_reason(found["long_two"].reason)
    assert not is_real_reason(found["long_three"].reason)
    assert not is_real_reason("big")
    module = "# long: the whole format in one place, read top to bottom\n" + "x = 1\n" * MAX_BENCH_MODULE_LINES
    (whole,) = excesses_of(module, "bench/sample.py")
    assert whole.key == "bench/sample.py" and is_real_reason(whole.reason)
    # A package module has no escape: over 500 lines it is an excess whatever its first lines say.
    (package,) = excesses_of("# long: one table read top to bottom\n" + "x = 1\n" * MAX_MODULE_LINES, "kb/sample.py")
    assert package.limit == MAX_MODULE_LINES and package.reason is None and not is_real_reason(package.reason)
    assert excesses_of("x = 1\n" * MAX_MODULE_LINES, "kb/sample.py") == []
    assert len(all_excesses()) >= len(ALLOWANCE)
