"""Sources parsed in many threads at once (an eval on a cluster reads every problem and solution in
a thread of its own): CPython's AST constructor keeps its depth counter in interpreter-wide state,
so unserialized parses fail now and then with "AST constructor recursion depth mismatch" (the scale
bench's coordinator did, on a good problem file); every parse of ours goes through
`harness.pyparse.parse`, one at a time."""

from __future__ import annotations

import ast
import gc
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kb_mcp.kb import pyparse

ROOT = Path(__file__).resolve().parents[2]


class _Finalized:
    """Garbage in a cycle whose finalizer runs Python code in whichever thread the collector runs in:
    a thread switch in the middle of another thread's parse, as in a busy coordinator."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        time.sleep(0)


def _failures(parse: Callable[[str], object], threads: int = 8, rounds: int = 40) -> list[BaseException]:
    source = "\n".join((ROOT / p).read_text() for p in ("harness/candidate.py", "harness/pool/pool.py"))
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run() -> None:
        start.wait()
        for _ in range(rounds):
            for _ in range(50):
                _Finalized()
            try:
                parse(source)
            except SystemError as exc:
                errors.append(exc)

    old = gc.get_threshold()
    gc.set_threshold(100, 5, 5)  # collections often, inside the parses
    try:
        workers = [threading.Thread(target=run) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=300)
    finally:
        gc.set_threshold(*old)
    return errors


def test_parses_in_many_threads_at_once_never_fail() -> None:
    errors = _failures(pyparse.parse)
    assert errors == [], f"{len(errors)} parses failed: {errors[0]}"


def test_parse_is_ast_parse() -> None:
    tree = pyparse.parse("def f(x):\n    return x + 1\n", "f.py")
    assert ast.dump(tree) == ast.dump(ast.parse("def f(x):\n    return x + 1\n"))


if __name__ == "__main__":  # the unserialized control: `python tests/harness/test_pyparse.py` (fails now and then)
    print(f"ast.parse: {len(_failures(ast.parse))} failed; pyparse.parse: {len(_failures(pyparse.parse))} failed")
    sys.exit(0)
