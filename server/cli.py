"""The `kb-mcp` command line: one entry point, one module per command group."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kb_mcp.server import cmd_call, cmd_campaign, cmd_eval, cmd_kb, cmd_serve

COMMANDS = (cmd_serve, cmd_call, cmd_kb, cmd_campaign, cmd_eval)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every command group registered."""
    parser = argparse.ArgumentParser(
        prog="kb-mcp",
        description="Optimize CUDA kernels with a shared, persistent Knowledge Base (MCP server and CLI).",
    )
    parser.add_argument(
        "--kb",
        metavar="PATH",
        help="KB file (default: $KB_MCP_KB, else ~/.kb-mcp/kb.json)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` and run the chosen command; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
