"""What `kb-mcp serve` tells a person at a terminal: which KB, which tools, how to connect an agent.

Printed to stderr only (stdout is the MCP wire on stdio).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from kb_mcp.server.env import ENV_TOKEN
from kb_mcp.server.gpu import gpu_summary


def _kb_line(kb_path: Path, stats_line: str) -> str:
    return f"KB: {kb_path} ({stats_line})" if stats_line else f"KB: {kb_path}"


def stdio_connect_lines(kb_arg: str | None) -> list[str]:
    """How to make an agent start this same server over stdio."""
    kb = f" --kb {shlex.quote(kb_arg)}" if kb_arg else ""
    args = (["--kb", kb_arg] if kb_arg else []) + ["serve"]
    args_json = ", ".join(f'"{a}"' for a in args)
    return [
        f"  Claude Code: claude mcp add kb-mcp -- kb-mcp{kb} serve",
        f'  Cursor (.cursor/mcp.json): {{"mcpServers": {{"kb-mcp": {{"command": "kb-mcp", "args": [{args_json}]}}}}}}',
        f'  VS Code (.vscode/mcp.json): {{"servers": {{"kb-mcp": {{"type": "stdio", "command": "kb-mcp", '
        f'"args": [{args_json}]}}}}}}',
    ]


def http_connect_lines(url: str, with_token: bool) -> list[str]:
    """How to point an agent at this HTTP server; `with_token` where it requires one (the shared token or
    an agent's own, which each agent sets as its KB_MCP_TOKEN: the same lines send either)."""
    header = f' --header "Authorization: Bearer ${ENV_TOKEN}"' if with_token else ""
    headers_json = f', "headers": {{"Authorization": "Bearer ${{env:{ENV_TOKEN}}}"}}' if with_token else ""
    return [
        f"  Claude Code: claude mcp add --transport http kb-mcp {url}{header}",
        f'  Cursor (.cursor/mcp.json): {{"mcpServers": {{"kb-mcp": {{"url": "{url}"{headers_json}}}}}}}',
        f'  VS Code (.vscode/mcp.json): {{"servers": {{"kb-mcp": {{"type": "http", "url": "{url}"{headers_json}}}}}}}',
    ]


def token_hint_lines(server_token: str | None) -> list[str]:
    """A warning when the connect lines above would send an empty token from this shell."""
    if server_token is None:
        return []
    value = os.environ.get(ENV_TOKEN)
    if not value:
        state = "is empty" if value == "" else "is not set"
        return [
            f"  note: {ENV_TOKEN} {state} in this shell, so the lines above would send an empty token "
            f"(401 'the bearer token is empty'): export {ENV_TOKEN}=<this server's token> where the agent runs"
        ]
    if value != server_token:
        return [f"  note: {ENV_TOKEN} in this shell is not this server's token; agents started from here would get 401"]
    return []


def print_banner(
    *,
    version: str,
    kb_path: Path,
    stats_line: str,
    tools: Sequence[str],
    gpu_tools: Sequence[str],
    connect: Sequence[str],
    footer: str,
    out: TextIO = sys.stderr,
) -> None:
    """Writes the banner to `out` (stderr)."""
    lines = [
        f"kb-mcp {version}".rstrip(),
        _kb_line(kb_path, stats_line),
        f"tools: {', '.join(tools)}",
        gpu_summary(gpu_tools),
        "connect an agent (details: docs/agents.md, ready files: clients/configs/):",
        *connect,
        footer,
    ]
    print("\n".join(lines), file=out, flush=True)
