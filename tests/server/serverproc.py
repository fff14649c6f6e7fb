"""Spawning real `kb-mcp serve --http` processes for end-to-end tests, and waiting until they listen."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from kb_mcp.clients.mcp_client import serve_command

_READY = re.compile(r"serving http (http://\S+/mcp) ")


@dataclass
class HttpServer:
    """A running `kb-mcp serve --http` process and what it printed."""

    proc: subprocess.Popen[str]
    url: str = ""
    stderr_lines: list[str] = field(default_factory=list)

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)


def _pump(server: HttpServer, ready: threading.Event) -> None:
    assert server.proc.stderr is not None
    for line in server.proc.stderr:
        server.stderr_lines.append(line)
        match = _READY.search(line)
        if match and not ready.is_set():
            server.url = match.group(1)
            ready.set()
    ready.set()  # the process ended


@contextmanager
def http_server(
    kb_path: Path | None,
    args: Sequence[str] = ("--http", "127.0.0.1:0"),
    *,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Iterator[HttpServer]:
    """Starts `kb-mcp [--kb kb_path] serve ARGS`, yields it once it listens, stops it afterwards."""
    proc = subprocess.Popen(
        serve_command(kb_path, list(args)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    server = HttpServer(proc)
    ready = threading.Event()
    threading.Thread(target=_pump, args=(server, ready), daemon=True).start()
    try:
        ready.wait(timeout)
        if not server.url:
            proc.kill()
            proc.wait(10)
            raise AssertionError(f"server did not start (exit {proc.returncode}):\n{server.stderr}")
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def run_cli(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 120.0,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Runs `kb-mcp ARGS` to completion with this interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "kb_mcp.server.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        env={**os.environ, **(env or {})},
    )


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    """Polls `predicate` until it is true or `timeout` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


@contextmanager
def endpoint_that_never_answers() -> Iterator[tuple[str, list[socket.socket]]]:
    """An LLM endpoint that accepts connections and never answers; yields its URL and the connections."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", held
    finally:
        listener.close()
        for conn in held:
            conn.close()


@asynccontextmanager
async def session_client(url: str, token: str) -> AsyncIterator[Client]:
    """A client on the handshake-era protocol: its requests carry the Mcp-Session-Id the server gave it."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(30.0, read=300.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            yield client
