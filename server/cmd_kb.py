"""`kb-mcp kb` (being built)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds the `kb` command."""
    p = sub.add_parser("kb", help="(being built)")
    p.set_defaults(func=lambda args: print("not built yet") or 2)
