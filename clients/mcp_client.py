"""Connecting to a kb-mcp server with the MCP SDK's client, and calling its tools as JSON.

Used by `kb-mcp call` and by the integration tests, so both talk to the server exactly the way
an agent's MCP client does: in-process (the SDK's in-memory transport), over stdio (a spawned
`kb-mcp serve`) or over streamable HTTP (with an optional bearer token).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import CallToolResult, TextContent

ProgressCallback = ProgressFnT  # the SDK's: (progress, total, message), awaited per notification


class ToolCallError(RuntimeError):
    """A tool answered with `isError`; the message is the server's text, `error` its structured
    form when the server sent one (kb-mcp does: whose the failure is, where, what to do)."""

    def __init__(self, tool: str, message: str, error: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.tool = tool
        self.message = message
        self.error = error or {}

    @property
    def whose(self) -> str:
        """'caller', 'environment' or 'kb-mcp' ('' when the server did not say)."""
        return str(self.error.get("whose", ""))


def serve_command(kb_path: str | os.PathLike[str] | None = None, extra_args: Sequence[str] = ()) -> list[str]:
    """The command line that starts `kb-mcp serve` with this interpreter (no PATH lookup needed)."""
    cmd = [sys.executable, "-m", "kb_mcp.server.cli"]
    if kb_path is not None:
        cmd += ["--kb", str(kb_path)]
    return [*cmd, "serve", *extra_args]


def stdio_params(
    kb_path: str | os.PathLike[str] | None = None,
    *,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> StdioServerParameters:
    """Parameters for the SDK's stdio client to spawn `kb-mcp serve` on `kb_path`.

    The child inherits this process's environment (the SDK passes only a safe subset by default,
    which would drop KB_MCP_HOME and friends), with `env` on top.
    """
    cmd = serve_command(kb_path, extra_args)
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env={**os.environ, **(env or {})}, cwd=cwd)


@asynccontextmanager
async def connect_http(
    url: str,
    token: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> AsyncIterator[Client]:
    """A connected client of the kb-mcp server at `url` (…/mcp), sending the bearer token if given
    (and any other `headers`, e.g. those of an agent's config file)."""
    headers = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
    # Reads stay open for long: a streamed tool response lasts as long as the tool runs.
    timeout = httpx2.Timeout(30.0, read=max(300.0, timeout_s or 0.0))
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        async with Client(
            streamable_http_client(url, http_client=http),
            read_timeout_seconds=timeout_s,
        ) as client:
            yield client


_INIT_PROBE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "kb-mcp-probe",
                                                                                   "version": "0"}},
}


def explain_http_failure(url: str, token: str | None) -> str:
    """Why connecting to `url` fails, in words (the SDK's client only says that it failed)."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        response = httpx2.post(url, json=_INIT_PROBE, headers=headers, timeout=10)
    except httpx2.HTTPError as exc:
        return f"nothing answers at {url} ({type(exc).__name__}: {exc}); is `kb-mcp serve --http` running there?"
    if response.status_code == 401:
        try:
            reason = str(response.json().get("error_description") or "")
        except ValueError:
            reason = ""
        if token:
            return (f"{url} refused the bearer token (401): "
                    f"{reason or 'check --token-file / $KB_MCP_TOKEN against the server'}")
        return f"{url} wants a bearer token (401): pass --token-file PATH or set KB_MCP_TOKEN" + (
            f" ({reason})" if reason else ""
        )
    if response.status_code == 421:
        return (
            f"{url} refused the Host name (421, DNS-rebinding protection): start the server with "
            "--allow-host for the name used in this URL"
        )
    if response.status_code == 404:
        return f"no MCP endpoint at {url} (404); kb-mcp serves it at /mcp"
    return f"{url} answered HTTP {response.status_code}: {response.text[:200]}"


def result_text(result: CallToolResult) -> str:
    """The text content of a tool result, joined."""
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def result_json(name: str, result: CallToolResult) -> dict[str, Any]:
    """The structured result of a successful call; raises ToolCallError for an `isError` result."""
    if result.is_error:
        structured = result.structured_content or {}
        error = structured.get("error") if isinstance(structured.get("error"), dict) else None
        raise ToolCallError(name, result_text(result), error)
    if result.structured_content is not None:
        return dict(result.structured_content)
    text = result_text(result)
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"text": text}
    return parsed if isinstance(parsed, dict) else {"result": parsed}


async def call_json(
    client: Client,
    name: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    progress: ProgressCallback | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Calls tool `name` and returns its structured result; raises ToolCallError if the tool failed."""
    result = await client.call_tool(
        name, dict(arguments or {}), read_timeout_seconds=timeout_s, progress_callback=progress
    )
    return result_json(name, result)
