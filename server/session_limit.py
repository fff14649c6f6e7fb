"""How many MCP sessions one client of an HTTP server may hold open (`sessions.SessionCap` enforces it).

Apart from `server.sessions`, which needs the MCP SDK, so that `kb-mcp doctor` and the CLI read and
check the setting without importing the HTTP stack.
"""

from __future__ import annotations

from collections.abc import Mapping

from kb_mcp.kb import settings

__all__ = ["DEFAULT_SESSIONS_PER_CLIENT", "ENV_SESSIONS_PER_CLIENT", "sessions_per_client"]

ENV_SESSIONS_PER_CLIENT = "KB_MCP_SESSIONS_PER_CLIENT"
DEFAULT_SESSIONS_PER_CLIENT = 16
"""An agent needs one session (a few, with helpers of its own); 16 leaves room for that and for
sessions a crashed client left behind until they idle out."""


def sessions_per_client(environ: Mapping[str, str] | None = None) -> int:
    """The most sessions one client may hold open ($KB_MCP_SESSIONS_PER_CLIENT, a whole number > 0;
    `DEFAULT_SESSIONS_PER_CLIENT` unset): refused by name (`SettingError`) if it is anything else."""
    return settings.count(ENV_SESSIONS_PER_CLIENT, DEFAULT_SESSIONS_PER_CLIENT, environ, positive=True)
