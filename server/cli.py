"""The `kb-mcp` command line: one entry point, one module per command.

Start-up is kept short by importing only the chosen command's module: `kb-mcp --help` and
`kb-mcp kb ...` never import the MCP SDK, the LLM client, torch or matplotlib (see
`bench/startup_bench.py` and docs/benchmarks.md). The one-line help of every command lives in
`COMMANDS`, so the top-level help needs none of the modules.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from kb_mcp.server import stdout
from kb_mcp.server.about import COMMAND, DIST_NAME

# command -> (module that registers it, its one-line help). The module's `register(sub)` adds the
# full parser with the same help (tests/server/test_cli.py checks they agree).
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("kb_mcp.server.cmd_serve", "run the MCP server (stdio by default, --http for a shared server)"),
    "call": ("kb_mcp.server.cmd_call", "call one tool and print its JSON result"),
    "kb": ("kb_mcp.server.cmd_kb", "create, inspect, browse, export, import and merge KB files"),
    "run-campaign": ("kb_mcp.server.cmd_campaign", "optimize a set of problems autonomously with an LLM (resumable)"),
    "eval": ("kb_mcp.server.cmd_eval",
             "verify solution files against KernelBench problems through the harness (no LLM)"),
    "worker": ("kb_mcp.server.cmd_worker",
               "serve this host's GPUs to a Dask scheduler, for eval and run-campaign --cluster"),
    "doctor": ("kb_mcp.server.cmd_doctor",
               "check this machine (GPU, driver, torch, nvcc, ncu, sandbox, KB) and say how to fix what fails"),
    "decompose": ("kb_mcp.server.cmd_decompose", "split a model (a level-3 problem) into parts worth one kernel each"),
    "compose": ("kb_mcp.server.cmd_compose",
                "compose a model's candidate from its parts' verified candidates and verify it"),
    "install-skill": ("kb_mcp.server.cmd_skill",
                      "install the kb-mcp Skill for Claude Code (the optimization round with these tools)"),
}


class _VersionAction(argparse.Action):
    """`--version`, looked up only when asked for (reading package metadata costs time)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from kb_mcp.server.about import package_version

        print(f"{COMMAND} {package_version() or '(not installed)'} ({DIST_NAME}, Python {sys.version.split()[0]})")
        parser.exit()


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command named on the command line (the first word that is not a global option)."""
    words = iter(argv)
    for word in words:
        if word == "--kb":
            next(words, None)
        elif not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser: the command chosen in `argv` fully registered, the others by name and help.

    With `argv=None` every command is registered in full (for tools that inspect the whole CLI).
    """
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Optimize CUDA kernels with a shared, persistent Knowledge Base (MCP server and CLI).",
        epilog=f"First time here? `{COMMAND} doctor` checks this machine; docs/agents.md connects an agent.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    parser.add_argument(
        "--kb",
        metavar="PATH",
        help="KB file (default: $KB_MCP_KB, else $KB_MCP_HOME/kb.json, else ~/.kb-mcp/kb.json)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = None if argv is None else chosen_command(argv)
    for name, (module, help_text) in COMMANDS.items():
        if argv is None or name == chosen:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` and run the chosen command; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone before the last write shows here, not at interpreter exit
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return stdout.INTERRUPTED
    except Exception as exc:
        if stdout.reader_gone(exc):  # `kb-mcp ... | head -1`: the reader had what it wanted
            stdout.silence()
            return stdout.READER_GONE
        # imported here, not at start-up: kb.errors builds a pydantic model, which `--help` need not pay for
        from kb_mcp.kb.errors import KbMcpError
        from kb_mcp.server import exit_status

        if not isinstance(exc, KbMcpError):
            raise
        print(f"{COMMAND} {args.command}: {exc}", file=sys.stderr)  # a command that did not word it itself
        return exit_status.of(exc)


if __name__ == "__main__":
    sys.exit(main())
