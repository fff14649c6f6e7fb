"""Fixtures of the campaign tests: the scripted LLM server and clients pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fakellm import FakeLLMServer, Script

from kb_mcp.clients.llm import LLMClient, LLMConfig


@pytest.fixture
def fake_llm() -> Iterator[Callable[[Script], FakeLLMServer]]:
    """Starts scripted servers on loopback; all are stopped at the end of the test."""
    servers: list[FakeLLMServer] = []

    def start(script: Script) -> FakeLLMServer:
        server = FakeLLMServer(script).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def client_for() -> Iterator[Callable[..., LLMClient]]:
    """Makes real openai-backed clients on a fake server, with quick retries; closed at the end."""
    clients: list[LLMClient] = []

    def make(server: FakeLLMServer, **config: object) -> LLMClient:
        values: dict[str, object] = {"base_url": server.base_url, "model": "fake-model", "max_retries": 2,
                                     "timeout_s": 10.0}
        values.update(config)
        client = LLMClient(LLMConfig(**values))  # type: ignore[arg-type]
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
