"""HTTP serve rules, as pure functions: bind parsing, loopback, token requirement, Host allow-list;
and the request body limit, on a spawned `kb-mcp serve --http` with raw requests as any client sends
them (a declared length, a chunked body) and with the SDK's client."""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from serverproc import HttpServer, http_server

from kb_mcp.clients.mcp_client import ToolCallError, call_json, connect_http
from kb_mcp.server.agents import AgentsFile, Credentials
from kb_mcp.server.transport import (
    MAX_REQUEST_BYTES,
    AuthProblem,
    ServeError,
    authenticate,
    http_options,
    is_loopback,
    parse_bind,
)
from kb_mcp.tools.source import MAX_SOURCE_BYTES

TOKEN = "t" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8765", ("127.0.0.1", 8765)),
        ("localhost:0", ("localhost", 0)),
        (":9000", ("127.0.0.1", 9000)),
        ("[::1]:8765", ("::1", 8765)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
    ],
)
def test_parse_bind(text: str, expected: tuple[str, int]) -> None:
    assert parse_bind(text) == expected


@pytest.mark.parametrize("text", ["8765", "host:", "host:http", "1.2.3.4:70000", "[::1]8765"])
def test_parse_bind_rejects(text: str) -> None:
    with pytest.raises(ServeError, match="HOST:PORT"):
        parse_bind(text)


@pytest.mark.parametrize(
    ("host", "loop"),
    [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("10.0.0.7", False), ("gpu-box.lan", False), ("::", False)],
)
def test_is_loopback(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


def test_loopback_needs_no_token_and_allows_only_loopback_names() -> None:
    opts = http_options("127.0.0.1:0", None)
    assert opts.token is None and opts.loopback
    assert set(opts.allowed_hosts) == {
        "127.0.0.1", "127.0.0.1:*", "localhost", "localhost:*", "[::1]", "[::1]:*",
    }
    assert "http://localhost:*" in opts.allowed_origins
    assert opts.security().enable_dns_rebinding_protection


def test_non_loopback_without_token_refuses_to_start() -> None:
    with pytest.raises(ServeError, match="refusing to serve on 10.0.0.7 without a bearer token.*KB_MCP_TOKEN"):
        http_options("10.0.0.7:8765", None)
    with pytest.raises(ServeError, match="too short"):
        http_options("10.0.0.7:8765", "short")


def test_non_loopback_allows_its_address_and_the_named_hosts() -> None:
    opts = http_options("10.0.0.7:8765", TOKEN, ["gpu-box.lan", "proxy.example:443"])
    assert "10.0.0.7:*" in opts.allowed_hosts and "gpu-box.lan:*" in opts.allowed_hosts
    assert "proxy.example:443" in opts.allowed_hosts and "proxy.example:*" not in opts.allowed_hosts
    assert "https://proxy.example:443" in opts.allowed_origins
    assert "evil.example:*" not in opts.allowed_hosts


def test_wildcard_bind_needs_an_allow_list() -> None:
    with pytest.raises(ServeError, match="--allow-host"):
        http_options("0.0.0.0:8765", TOKEN)
    opts = http_options("0.0.0.0:8765", TOKEN, ["10.0.0.7"])
    assert "10.0.0.7:*" in opts.allowed_hosts and "0.0.0.0:*" not in opts.allowed_hosts
    assert opts.url(8765) == "http://127.0.0.1:8765/mcp"


@pytest.mark.parametrize(
    ("header", "error", "words"),
    [
        (None, "invalid_request", "no bearer token"),
        ("", "invalid_request", "no bearer token"),
        ("Basic dXNlcjpwYXNz", "invalid_request", "scheme 'Basic'"),
        ("Bearer ", "invalid_request", "token is empty"),
        ("Bearer ${KB_MCP_TOKEN}", "invalid_token", "unexpanded text '${KB_MCP_TOKEN}'"),
        ("Bearer $KB_MCP_TOKEN", "invalid_token", "unexpanded"),
        ("Bearer ${env:KB_MCP_TOKEN}", "invalid_token", "unexpanded"),
        ("Bearer ${input:kb-mcp-token}", "invalid_token", "unexpanded"),
        (f"Bearer {TOKEN[:-1]}", "invalid_token", "not one of this server's tokens"),
    ],
)
def test_each_refusal_says_what_is_wrong(header: str | None, error: str, words: str) -> None:
    problem = authenticate(header, Credentials(TOKEN))
    assert isinstance(problem, AuthProblem) and problem.error == error and words in problem.description
    challenge = problem.www_authenticate()
    assert challenge.startswith('Bearer realm="kb-mcp", error="' + error + '"')
    assert "resource_metadata" not in challenge  # what makes MCP clients start OAuth discovery
    assert challenge.count('"') == 6  # the description cannot break out of its quotes


def test_the_right_token_passes_in_any_scheme_case() -> None:
    assert authenticate(f"Bearer {TOKEN}", Credentials(TOKEN)) == "mcp-http"
    assert authenticate(f"bearer {TOKEN}", Credentials(TOKEN)) == "mcp-http"


ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789ab"


def _agents(tmp_path: Path, text: str) -> AgentsFile:
    path = tmp_path / "agents"
    path.write_text(text)
    return AgentsFile(path)


def test_each_agents_token_names_its_agent_and_the_shared_token_the_shared_client(tmp_path: Path) -> None:
    both = Credentials(TOKEN, _agents(tmp_path, f"alice {ALICE}\nbob {BOB}\n"))
    assert authenticate(f"Bearer {ALICE}", both) == "agent:alice"
    assert authenticate(f"Bearer {BOB}", both) == "agent:bob"
    assert authenticate(f"Bearer {TOKEN}", both) == "mcp-http"
    assert isinstance(authenticate(f"Bearer {ALICE}x", both), AuthProblem)
    agents_only = Credentials(None, both.agents_file)
    assert agents_only.required  # a loopback server with an agents file still wants a token
    assert isinstance(authenticate(f"Bearer {TOKEN}", agents_only), AuthProblem)
    assert ALICE not in repr(both) and TOKEN not in repr(both)  # a token is never shown


def test_an_agents_file_is_a_token_for_a_server_off_loopback(tmp_path: Path) -> None:
    opts = http_options("10.0.0.7:8765", None, agents_file=_agents(tmp_path, f"alice {ALICE}\n"))
    assert opts.credentials.required and opts.token is None


def test_an_unexpanded_server_token_is_refused_at_start() -> None:
    with pytest.raises(ServeError, match="unexpanded"):
        http_options("0.0.0.0:8765", "${KB_MCP_TOKEN}", ["gpu-box"])


@pytest.mark.parametrize("token", ["caf\u00e9-shared-token-0123456789", "tab\tshared-token-0123456789"])
def test_a_server_token_no_client_can_send_is_refused_at_start(token: str) -> None:
    with pytest.raises(ServeError, match="no client can send in an HTTP header") as refused:
        http_options("0.0.0.0:8765", token, ["gpu-box"])
    assert token not in str(refused.value)


# -- the request body limit, over real HTTP -----------------------------------------------------------

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    kb = tmp_path_factory.mktemp("body") / "kb.json"
    with http_server(kb, ["--http", "127.0.0.1:0"], env={"KB_MCP_TOKEN": TOKEN}) as running:
        yield running


def _exchange(url: str, head: dict[str, str], chunks: Iterator[bytes]) -> tuple[bytes, int]:
    """POSTs `head` and then `chunks` on a raw socket, stopping as soon as the server answers; returns
    the answer (head and body) and how many body bytes were sent before it came."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        lines = [f"POST {parts.path} HTTP/1.1", f"Host: {parts.netloc}", f"Authorization: Bearer {TOKEN}",
                 *(f"{k}: {v}" for k, v in {**HEADERS, **head}.items())]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        sent = 0
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered: it reads no further
            try:
                sock.sendall(chunk)
            except OSError:  # it answered and closed while this was being sent
                break
            sent += len(chunk)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    return answer, sent


def _length(answer: bytes) -> int:
    """The Content-Length of a response's head."""
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _refusal(answer: bytes) -> dict[str, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"content-type: application/json" in head.lower()
    return dict(json.loads(body))


def test_a_declared_body_over_the_limit_is_refused_before_any_of_it_is_sent(server: HttpServer) -> None:
    declared = 100 << 20
    answer, _ = _exchange(server.url, {"Content-Length": str(declared)}, iter(()))  # sends no body at all
    refusal = _refusal(answer)
    assert refusal["error"] == "request_too_large"
    assert f"the request body is {declared} bytes, over the {MAX_REQUEST_BYTES} bytes (8 MiB)" \
        in refusal["error_description"]
    assert "a problem or candidate is at most 1 MiB" in refusal["error_description"]


def test_a_chunked_body_is_refused_once_it_passes_the_limit(server: HttpServer) -> None:
    chunk = b"x" * (1 << 20)
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    answer, sent = _exchange(server.url, {"Transfer-Encoding": "chunked"}, (framed for _ in range(256)))
    refusal = _refusal(answer)
    assert refusal["error"] == "request_too_large"
    assert f"passed {MAX_REQUEST_BYTES} bytes (chunked" in refusal["error_description"]
    assert sent < 64 << 20  # answered long before the 256 MiB the client had to send


async def test_a_request_with_two_sources_at_the_limit_reaches_the_tool(server: HttpServer) -> None:
    # a comment of backslashes doubles in JSON: two sources of 1 MiB make a body of over 4 MiB
    source = "#" + "\\" * (MAX_SOURCE_BYTES - 1)
    async with connect_http(server.url, TOKEN) as client:
        with pytest.raises(ToolCallError) as err:
            await call_json(client, "compile_and_verify", {"problem": source, "candidate": source})
    assert err.value.error is not None and err.value.error["whose"] == "caller"
    assert "not a KernelBench problem, missing top-level Model" in str(err.value)  # the tool read it whole
