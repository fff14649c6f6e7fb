"""Names of the environment variables the server's commands read (kept apart from the modules
that use them, so the CLI can name them in its help without importing the HTTP stack)."""

from __future__ import annotations

__all__ = ["ENV_TOKEN"]

ENV_TOKEN = "KB_MCP_TOKEN"
"""The bearer token of an HTTP server (`kb-mcp serve --http`) and of `kb-mcp call --url`."""
