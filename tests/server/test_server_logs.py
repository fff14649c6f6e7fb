"""The server's log under a client that is refused in a loop: a real `kb-mcp serve --http` answers
every refused request as before, but writes a few lines for each sender and then one count, and
other senders' refusals still get their lines; the throttle behind it holds bounded memory."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from serverproc import HttpServer, http_server, wait_until

from kb_mcp.harness.sandbox.attempts import Attempt, announce
from kb_mcp.server import logs
from kb_mcp.server.logs import Throttle

TOKEN = "logs-test-token-0123456789abcdef"
WRONG = "wrong-token-text-0123456789abcdef"
INIT = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


class _Lines(logging.Handler):
    """Keeps every record's message: what a log file would hold."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[tuple[logging.Logger, list[str]]]:
    logger = logging.getLogger("kb_mcp.tests.throttle")
    handler = _Lines()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield logger, handler.lines
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HttpServer]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with http_server(tmp_path / "kb.json", ["--http", "127.0.0.1:0", "--token-file", str(token_file)]) as running:
        yield running


def _refuse(url: str, count: int, authorization: str, local_address: str = "127.0.0.1") -> None:
    """Sends `count` requests with `authorization` from `local_address`; each must be answered 401."""
    with httpx2.Client(transport=httpx2.HTTPTransport(local_address=local_address), timeout=30) as http:
        for _ in range(count):
            answer = http.post(url, json=INIT, headers={**HEADERS, "Authorization": authorization})
            assert answer.status_code == 401 and "not one of this server's tokens" in answer.text


def _lines_401(server: HttpServer) -> list[str]:
    return [line for line in server.stderr_lines if "(401)" in line]


def test_a_client_refused_500_times_writes_its_first_refusal_whole_and_then_a_count(server: HttpServer) -> None:
    _refuse(server.url, 500, f"Bearer {WRONG}")
    first = _lines_401(server)
    assert first and "refused a request from 127.0.0.1 (401): the bearer token is not one of this server's " \
        "tokens: check the token your client sends" in first[0], server.stderr
    assert len(first) <= 5, first
    server.proc.terminate()  # the window is still open: the server writes its count as it stops
    assert wait_until(lambda: "more like it" in server.stderr, timeout=30), server.stderr
    written = _lines_401(server)
    assert len(written) <= 6, written
    assert any(f"and {500 - len(first)} more like it from 127.0.0.1 in the last" in line for line in written), written
    assert WRONG not in server.stderr


def test_another_senders_refusals_are_still_logged_while_one_is_held_back(server: HttpServer) -> None:
    _refuse(server.url, 200, f"Bearer {WRONG}")
    _refuse(server.url, 1, f"Bearer {WRONG}", local_address="127.0.0.2")
    assert wait_until(lambda: any("from 127.0.0.2 (401)" in line for line in server.stderr_lines)), server.stderr
    assert len(_lines_401(server)) <= 6, _lines_401(server)


def test_a_token_sent_without_the_bearer_scheme_stays_out_of_the_log(server: HttpServer) -> None:
    answer = httpx2.post(server.url, json=INIT, headers={**HEADERS, "Authorization": WRONG}, timeout=30)
    assert answer.status_code == 401 and "uses the scheme" in answer.text  # the client is still told
    assert wait_until(lambda: bool(_lines_401(server))), server.stderr
    assert "does not use the Bearer scheme" in server.stderr and WRONG[:20] not in server.stderr


def test_a_throttle_keeps_at_most_max_keys_windows_however_many_senders(
        lines: tuple[logging.Logger, list[str]]) -> None:
    logger, written = lines
    throttle = Throttle(burst=2, window_s=60, max_keys=50)
    for peer in range(10_000):
        address = f"10.0.{peer >> 8}.{peer & 255}"
        throttle.log(logger, logging.INFO, "refused requests (401)", address, "refused %d", peer)
        assert len(throttle) <= 51
    assert len(written) == 50 + 2, written[-5:]  # one line each for the first 50, two for all the others
    throttle.flush()
    assert len(throttle) == 0
    assert written[-1] == "refused requests (401): ... and 9,948 more like it from other senders in the last 0 s"


def test_a_window_writes_its_count_when_it_closes_and_then_lets_lines_through_again(
        lines: tuple[logging.Logger, list[str]]) -> None:
    logger, written = lines
    throttle = Throttle(burst=1, window_s=0.3)
    for n in range(3):
        throttle.log(logger, logging.WARNING, "refused sessions (429)", "agent:alice", "refused %d", n)
    assert written == ["refused 0"]
    assert wait_until(lambda: len(written) == 2, timeout=5), written  # no further line needed
    assert written[1].startswith("refused sessions (429): ... and 2 more like it from agent:alice in the last")
    throttle.log(logger, logging.WARNING, "refused sessions (429)", "agent:alice", "refused %d", 3)
    assert written[2] == "refused 3"


def test_a_loop_of_sandbox_attempts_is_a_few_lines_and_a_count(caplog: pytest.LogCaptureFixture) -> None:
    logs.log_attempts()
    client = "agent:attempts-in-a-loop"
    with caplog.at_level(logging.WARNING, logger="kb_mcp.attempts"):
        for n in range(100):
            announce(Attempt(kind="network", what=f"connect 10.0.0.{n}:443", role="worker"), client)
        logs.refusals.flush()
    said = [r.getMessage() for r in caplog.records if client in r.getMessage()]
    assert said[0] == f"sandbox attempt by {client}: network: connect 10.0.0.0:443 (worker)"
    assert len(said) <= 6 and f"and {100 - len(said) + 1} more like it from {client}" in said[-1], said
