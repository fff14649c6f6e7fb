"""HTTP serve rules, as pure functions: bind parsing, loopback, token requirement, Host allow-list."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.server.agents import AgentsFile, Credentials
from kb_mcp.server.transport import AuthProblem, ServeError, authenticate, http_options, is_loopback, parse_bind

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
