"""The exit statuses of every `kb-mcp` command, by whose fault a refusal is: the one place that says
them (the numbers come from `kb.errors.EXIT_STATUS`; docs/agents.md, "Exit statuses", is their table).

A script or a CI job reads them to tell "fix your input" (1) from "fix the command line" (2), "fix the
machine" (3) and "report a bug" (4). A command returns one of these names, never a number of its own.
"""

from __future__ import annotations

from kb_mcp.kb.errors import EXIT_STATUS, Fault
from kb_mcp.server.stdout import INTERRUPTED, READER_GONE

__all__ = ["BUG", "CALLER", "ENVIRONMENT", "INTERRUPTED", "OK", "READER_GONE", "STATUSES", "USAGE", "for_fault",
           "of"]
# INTERRUPTED and READER_GONE live in `stdout`, which the entry point reads without pydantic

OK = 0
CALLER = EXIT_STATUS["caller"]  # the arguments or inputs were refused: fix them and run again
USAGE = EXIT_STATUS["usage"]  # the command line cannot be used as given (argparse's own status too)
ENVIRONMENT = EXIT_STATUS["environment"]  # the machine's: files, disk, GPU, tools, a server out of reach
BUG = EXIT_STATUS["kb-mcp"]  # a kb-mcp bug

STATUSES: dict[int, str] = {
    OK: "success",
    CALLER: "caller",
    USAGE: "usage",
    ENVIRONMENT: "environment",
    BUG: "kb-mcp",
    INTERRUPTED: "interrupted",
    READER_GONE: "reader gone",
}
"""Every status a command exits with, by the name docs/agents.md's table gives it."""


def for_fault(fault: Fault) -> int:
    """The exit status of a refusal that is `fault`'s to fix."""
    return EXIT_STATUS[fault]


def of(exc: BaseException, default: Fault = "caller") -> int:
    """The exit status of a refusal raised as `exc`: its `whose` where it says one (every `KbMcpError`,
    and the campaign's, selection's and serve's errors), else `default`."""
    whose = getattr(exc, "whose", None)
    return EXIT_STATUS[whose] if whose in EXIT_STATUS else EXIT_STATUS[default]
