"""Names of the environment variables the server's commands read (kept apart from the modules
that use them, so the CLI can name them in its help without importing the HTTP stack)."""

from __future__ import annotations

__all__ = ["ENV_AGENTS", "ENV_FILES", "ENV_TOKEN"]

ENV_TOKEN = "KB_MCP_TOKEN"
"""The bearer token of an HTTP server (`kb-mcp serve --http`) and of `kb-mcp call --url`."""

ENV_FILES = "KB_MCP_FILES"
"""The folders whose files an HTTP server reads for its clients (`kb-mcp serve --http --files DIR`),
separated by os.pathsep; unset: none (clients send the text)."""

ENV_AGENTS = "KB_MCP_AGENTS"
"""The agents file of an HTTP server (`kb-mcp serve --http --agents-file PATH`): one `NAME TOKEN` line
per agent, so the server tells its agents apart (`server.agents`)."""
