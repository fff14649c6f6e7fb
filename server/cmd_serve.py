"""`kb-mcp serve` (being built)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds the `serve` command."""
    p = sub.add_parser("serve", help="(being built)")
    p.set_defaults(func=lambda args: print("not built yet") or 2)
