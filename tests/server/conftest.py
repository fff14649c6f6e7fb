"""Fixtures for the server tests: a toy tool module, in-process servers, spawned server processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import toy_tool  # tests/server is on sys.path for its own test modules

from kb_mcp.server.app import KbMcpServer, build_server
from kb_mcp.server.registry import ToolSpec
from kb_mcp.tools.context import ToolContext


@pytest.fixture
def toy_spec() -> ToolSpec:
    """The toy tool as the server sees a tool module."""
    return ToolSpec.from_module(toy_tool)


@pytest.fixture
def toy_server(kb_path: Path, toy_spec: ToolSpec) -> Iterator[KbMcpServer]:
    """A server with only the toy tool (plus the job tools), on a KB path that is never opened."""
    server = build_server(ToolContext(kb_path), tools=[toy_spec])
    yield server
    server.jobs.shutdown(wait=True)
    server.kb_ctx.close()


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Tests that run the CLI in this process configure logging; later tests get it back as it was."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
