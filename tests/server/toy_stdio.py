"""`kb-mcp serve` over stdio with the toy tool added; run as a script by the error tests.

    python toy_stdio.py KB LOG      serve the product tools and toy_count on KB, logging to LOG
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
import toy_tool

from kb_mcp.server import logs
from kb_mcp.server.app import build_server
from kb_mcp.server.registry import ToolSpec, load_tools
from kb_mcp.tools.context import ToolContext

if __name__ == "__main__":
    logs.configure("INFO")
    handler = logging.FileHandler(sys.argv[2])
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    server = build_server(ToolContext(sys.argv[1]), tools=[*load_tools(), ToolSpec.from_module(toy_tool)])
    anyio.run(server.run_stdio_async)
