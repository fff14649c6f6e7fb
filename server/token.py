"""The HTTP bearer token: read from a file or the environment, never from the command line, where
every user of the machine could read it (`ps`, `/proc/PID/cmdline`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kb_mcp.server.env import ENV_TOKEN

__all__ = ["TOKEN_ON_COMMAND_LINE", "add_token_arguments", "read_token"]

TOKEN_ON_COMMAND_LINE = (
    "--token is not accepted: a token on the command line is readable by every user of this machine "
    f"(ps, /proc/PID/cmdline). Put it in a file (--token-file PATH) or in ${ENV_TOKEN}"
)


def add_token_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """`--token-file` (and a `--token` that explains why it is refused)."""
    p.add_argument("--token-file", metavar="PATH", help=f"a file holding {what} (default: ${ENV_TOKEN})")
    p.add_argument("--token", help=argparse.SUPPRESS)


def read_token(args: argparse.Namespace) -> str | None:
    """The bearer token from --token-file, else $KB_MCP_TOKEN, else None; raises ValueError with a
    message for the user (a --token on the command line, an empty file), a KbMcpError for a file
    that cannot be read (whose says whether the path or the machine is at fault). The token is
    registered as a secret: it is redacted from everything the server returns or stores."""
    from kb_mcp.tools.disclosure import register_secret

    if getattr(args, "token", None):
        raise ValueError(TOKEN_ON_COMMAND_LINE)
    token: str | None
    if args.token_file:
        path = Path(args.token_file).expanduser()
        try:
            token = path.read_text().strip()
        except OSError as exc:  # no such file: the caller's (KbMcpError); permissions, a failing disk: the machine's
            from kb_mcp.kb.errors import input_error

            raise input_error(exc, "the token file", path) from exc
        if not token:
            raise ValueError(f"the token file {path} is empty")
    else:
        token = os.environ.get(ENV_TOKEN) or None
    if token:
        register_secret(token)
    return token
