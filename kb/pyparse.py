"""`ast.parse`, one call at a time in this process.

CPython (3.11 at least) keeps the depth counter of its AST constructor in interpreter-wide state, so
two threads turning parse trees into `ast` objects at once can leave it unbalanced, and one of them
fails with "SystemError: AST constructor recursion depth mismatch" on a perfectly good source (an
eval on a cluster reads and checks every problem and solution in threads of its own at once). Every
parse of ours outside the sandboxed workers goes through `parse`, under one lock; a parse takes
milliseconds.
"""

from __future__ import annotations

import ast
import threading

__all__ = ["parse"]

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)` under the process's parse lock; raises what it raises."""
    with _LOCK:
        return ast.parse(source, filename=filename)
