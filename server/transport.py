"""Serving over streamable HTTP: where to bind, who may connect, and the bearer token.

Rules (from the product design):
* bound to loopback, a token is optional (if given, it is enforced);
* bound to anything else, a token is required: without one the server refuses to start;
* DNS-rebinding protection stays on with an explicit allow-list of Host names: loopback names
  for a loopback bind, the bound address plus every `--allow-host` otherwise. A wildcard bind
  (0.0.0.0, ::) has no name of its own, so it needs `--allow-host`;
* a request body over `MAX_REQUEST_BYTES` is refused (413) as it arrives, before the MCP app reads it;
* a client already holding its most open MCP sessions (`sessions.SessionCap`) is refused a new one (429).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import TransportSecuritySettings

from kb_mcp.kb.errors import Fault
from kb_mcp.server.agents import (
    CLIENT_SCOPE_KEY,
    MIN_TOKEN_CHARS,
    PLACEHOLDER,
    AgentsFile,
    Credentials,
    unsendable,
)
from kb_mcp.server.env import ENV_AGENTS, ENV_TOKEN
from kb_mcp.server.logs import refusals
from kb_mcp.server.sessions import SessionCap, SessionCapReached, opens_session
from kb_mcp.tools.source import MAX_SOURCE_BYTES

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
MAX_REQUEST_BYTES = 8 * MAX_SOURCE_BYTES
"""The largest HTTP request body the server reads: 8 MiB. The largest legitimate one is a tool call
with two sources (a problem and a candidate, `MAX_SOURCE_BYTES` each) in JSON, whose escapes can
double a text; one client sending more must not hold the server's memory, so the gate counts a body
as it arrives and refuses it (413) once it passes this, whether or not it declared its length."""


class ServeError(ValueError):
    """A serve configuration that must not start; the message says how to fix it, `whose` who does:
    the command line ("usage", the default) or the machine ("environment": a port it cannot bind)."""

    def __init__(self, message: str, *, whose: Fault = "usage") -> None:
        super().__init__(message)
        self.whose: Fault = whose


@dataclass(frozen=True)
class HttpOptions:
    """A validated HTTP serve configuration."""

    host: str  # as bound (IPv6 without brackets)
    port: int
    token: str | None  # the shared token
    allowed_hosts: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)
    agents_file: AgentsFile | None = None  # each agent's own token

    @property
    def credentials(self) -> Credentials:
        """The tokens requests may carry, and who each one is."""
        return Credentials(self.token, self.agents_file)

    @property
    def loopback(self) -> bool:
        """True when only this machine can reach the server."""
        return is_loopback(self.host)

    def url(self, port: int | None = None) -> str:
        """The MCP endpoint URL for clients on this machine (or the bound name)."""
        host = self.host
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port if port is None else port}{MCP_PATH}"

    def security(self) -> TransportSecuritySettings:
        """DNS-rebinding protection with this configuration's allow-lists."""
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=list(self.allowed_hosts),
            allowed_origins=list(self.allowed_origins),
        )


def parse_bind(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[IPv6]:PORT` or `:PORT` (loopback) into (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
    else:
        host, sep, port_text = text.rpartition(":")
        sep = sep or ""
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ServeError(f"--http wants HOST:PORT (e.g. 127.0.0.1:8765 or [::1]:8765), got {text!r}")
    return host or "127.0.0.1", int(port_text)


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; names other than localhost count as non-loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_patterns(name: str) -> tuple[list[str], list[str]]:
    """Host-header and Origin patterns for one allowed name (with or without a port)."""
    bare = name.strip()
    if not bare:
        return [], []
    if ":" in bare and not bare.startswith("["):
        try:  # a bare IPv6 address gets brackets, as in a Host header
            ipaddress.IPv6Address(bare)
            bare = f"[{bare}]"
        except ValueError:
            pass
    has_port = bare.rsplit("]", 1)[-1].count(":") == 1
    hosts = [bare] if has_port else [bare, f"{bare}:*"]
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
    return hosts, origins


def http_options(bind: str, token: str | None, allow_hosts: Sequence[str] = (),
                 agents_file: AgentsFile | None = None) -> HttpOptions:
    """Validates a serve configuration (`agents_file`: read and checked by `agents.read_agents`);
    raises ServeError with the fix when it must not start."""
    host, port = parse_bind(bind)
    token = token or None
    if token is not None and PLACEHOLDER.match(token):
        raise ServeError(
            f"the bearer token is the unexpanded text {token!r}: the variable it names is not set where this "
            f"server starts; set it (e.g. export {ENV_TOKEN}=...) or put the token in a file and pass --token-file PATH"
        )
    why = unsendable(token) if token is not None else None
    if why is not None:
        raise ServeError(f"the bearer token (--token-file or ${ENV_TOKEN}) {why}")
    loopback = is_loopback(host)
    if not loopback:
        if token is None and agents_file is None:
            raise ServeError(
                f"refusing to serve on {host} without a bearer token: anyone who can reach this port could "
                f"run code on its GPU and write to the KB. Set {ENV_TOKEN} (or pass --token-file PATH), e.g.\n"
                f"  export {ENV_TOKEN}=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')\n"
                f"or give each agent a token of its own (--agents-file PATH or ${ENV_AGENTS})"
            )
        if token is not None and len(token) < MIN_TOKEN_CHARS:
            raise ServeError(f"the bearer token is too short ({len(token)} chars); use at least {MIN_TOKEN_CHARS}")
    names: list[str] = list(LOOPBACK_NAMES)
    if not loopback and host not in ("0.0.0.0", "::"):
        names.append(host)
    names.extend(allow_hosts)
    if host in ("0.0.0.0", "::") and not allow_hosts:
        raise ServeError(
            f"bound to every interface ({host}): name the host names or addresses clients will use with "
            "--allow-host (repeatable), e.g. --allow-host gpu-box.lan --allow-host 10.0.0.7; requests with "
            "any other Host header are refused (DNS-rebinding protection)"
        )
    allowed_hosts: list[str] = []
    allowed_origins: list[str] = []
    for name in names:
        hosts, origins = _host_patterns(name)
        allowed_hosts += [h for h in hosts if h not in allowed_hosts]
        allowed_origins += [o for o in origins if o not in allowed_origins]
    return HttpOptions(host, port, token, allowed_hosts, allowed_origins, agents_file)


def check_bindable(host: str, port: int) -> None:
    """Raises ServeError now, with the reason, if (host, port) cannot be bound (e.g. already in use)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ServeError(f"cannot bind {host}:{port}: {exc.strerror or exc}", whose="environment") from exc


async def serve_http(app: ASGIApp, options: HttpOptions, on_ready: Callable[[int], None]) -> None:
    """Runs `app` (an ASGI app) under uvicorn until interrupted; `on_ready(port)` once it accepts.

    uvicorn binds the address itself: handing it a pre-bound socket instead measured ~50 ms per
    request on loopback (vs ~5 ms), see docs/benchmarks.md.
    """
    import uvicorn

    check_bindable(options.host, options.port)
    config = uvicorn.Config(
        app, host=options.host, port=options.port, log_level="warning", lifespan="on", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await anyio.sleep(0.02)
        on_ready(server.servers[0].sockets[0].getsockname()[1])

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        await server.serve()
        tg.cancel_scope.cancel()


# -- bearer token check ------------------------------------------------------------------------------
#
# kb-mcp's HTTP server takes static bearer tokens (a shared one, and one per agent of an agents
# file); it is not an OAuth resource server. MCP
# clients start OAuth discovery from a 401 whose WWW-Authenticate names `resource_metadata`, or by
# fetching /.well-known/oauth-protected-resource and /.well-known/oauth-authorization-server. So a
# 401 here never names resource metadata, every /.well-known/ path answers 404 saying there is no
# OAuth, and the 401 says in words whether the token was missing, empty, unexpanded or wrong.

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

REALM = "kb-mcp"


@dataclass(frozen=True)
class AuthProblem:
    """Why a request's credentials were refused: an RFC 6750 error code and a sentence for people."""

    error: str  # invalid_request (nothing usable sent) or invalid_token (the wrong token)
    description: str
    placeholder: str | None = None  # the unexpanded variable the client sent, if that is what it sent
    logged: str | None = None  # the description for the server's log where the client's own text must stay out

    @property
    def log_description(self) -> str:
        """The refusal for the server's log: never any of the text the client sent as its credentials."""
        return self.logged or self.description

    def www_authenticate(self) -> str:
        """The WWW-Authenticate value: the scheme, realm and error, and no OAuth resource metadata."""
        text = self.description.replace("\\", "\\\\").replace('"', "'")
        return f'Bearer realm="{REALM}", error="{self.error}", error_description="{text}"'

    def body(self) -> bytes:
        """The JSON body of the 401."""
        return json.dumps({"error": self.error, "error_description": self.description}).encode()


def authenticate(authorization: str | None, credentials: Credentials) -> str | AuthProblem:
    """Who sends an `Authorization` header (an agent's name, or `agents.SHARED_CLIENT` for the shared
    token), or what is wrong with it, for a server accepting `credentials`."""
    if authorization is None or not authorization.strip():
        return AuthProblem(
            "invalid_request",
            f"no bearer token: this kb-mcp server requires the header 'Authorization: Bearer <token>' "
            f"with the token the server was started with (its {ENV_TOKEN}, or your own from its agents file)",
        )
    scheme, _, presented = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return AuthProblem(
            "invalid_request",
            f"the Authorization header uses the scheme {scheme[:20]!r}; send 'Authorization: Bearer <token>'",
            # a header of the token alone makes the token its "scheme": not for the log
            logged="the Authorization header does not use the Bearer scheme",
        )
    presented = presented.strip()
    if not presented:
        return AuthProblem(
            "invalid_request",
            "the bearer token is empty: the variable your client configuration takes it from is empty or unset "
            f"where the client runs (export {ENV_TOKEN}=... before starting the client)",
        )
    if PLACEHOLDER.match(presented):
        return AuthProblem(
            "invalid_token",
            f"the bearer token is the unexpanded text {presented!r}: your client did not substitute that variable "
            "(it is unset where the client runs, or this client does not expand variables in headers); "
            "set it, or write the token into the configuration",
            placeholder=presented,
        )
    client = credentials.client_of(presented)
    if client is None and credentials.agents_file is not None and credentials.agents_file.unusable:
        return AuthProblem("invalid_token", "the bearer token is not accepted now: this server's agents file cannot be "
                           "used since its last change (the operator's to fix), so no agent's own token is accepted "
                           "until it is right again; ask the server's operator, or use the shared token if you have it")
    if client is None:
        return AuthProblem("invalid_token",
                           "the bearer token is not one of this server's tokens: check the token your client sends")
    return client


class BearerGate:
    """ASGI middleware in front of the MCP app: the bearer-token check, and no OAuth endpoints.

    A request it lets through carries who sent it in its scope (`CLIENT_SCOPE_KEY`): an agent of the
    agents file, or the shared token's client. Without any token (a loopback server started without
    one) only the /.well-known/ answers apply, and nobody is named. Either way its body is at most
    `max_body` bytes (`MAX_REQUEST_BYTES`): a larger one is answered 413 and never reaches the app.
    A named client's request that would open an MCP session while it holds the most `sessions` allows
    is answered 429 and never reaches the app either. Each refusal is logged through `logs.refusals`:
    a client refused in a loop writes a few lines and a count, under the name its token proves or,
    without one, its peer address (never the token it sent).
    """

    def __init__(self, app: ASGIApp, credentials: Credentials, max_body: int = MAX_REQUEST_BYTES,
                 sessions: SessionCap | None = None) -> None:
        self.app = app
        self.credentials = credentials
        self.max_body = max_body
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if str(scope.get("path", "")).startswith("/.well-known/"):
            await _send_json(send, 404, {
                "error": "not_found",
                "error_description": "kb-mcp does not use OAuth: it takes a static bearer token "
                "('Authorization: Bearer <token>'), or none on a loopback server started without one",
            })
            return
        # Whatever a client put in the scope itself is not trusted: only this gate names the sender.
        scope.pop(CLIENT_SCOPE_KEY, None)
        scope.pop("user", None)
        if self.credentials.required:
            found = authenticate(_header(scope, b"authorization"), self.credentials)
            if isinstance(found, AuthProblem):
                _log_unauthorized(found, _peer(scope))
                await _send_json(send, 401, found.body(), [(b"www-authenticate", found.www_authenticate().encode())])
                return
            scope[CLIENT_SCOPE_KEY] = found
            scope["user"] = _principal(found)
        body = await _read_body(scope, receive, self.max_body)
        if isinstance(body, BodyTooLarge):
            who = scope.get(CLIENT_SCOPE_KEY) or _peer(scope)
            refusals.log(log, logging.INFO, "refused requests (413)", who,
                         "refused a request of %s (413): %s", who, body.description)
            await _send_json(send, 413, body.body())
            return
        client = scope.get(CLIENT_SCOPE_KEY)
        if self.sessions is None or client is None or not opens_session(scope):
            await self.app(scope, body, send)
            return
        opening = self.sessions.admit(client)
        if isinstance(opening, SessionCapReached):
            refusals.log(log, logging.INFO, "refused sessions (429)", client,
                         "refused a new session (429): %s", opening.description)
            await _send_json(send, 429, opening.body(), opening.headers())
            return
        try:
            await self.app(scope, body, opening.watch(send))
        finally:
            opening.started()  # it ended without a response: nothing was opened


def _log_unauthorized(problem: AuthProblem, peer: str) -> None:
    """Logs a 401 under its peer address: an unexpanded variable as a warning (the operator can tell
    that client's owner what to set), anything else as a refusal. Neither names the token sent."""
    if problem.placeholder is not None:
        refusals.log(log, logging.WARNING, "unexpanded bearer tokens", peer,
                     "a client at %s sent the unexpanded text %r as its bearer token: the variable in that "
                     "client's configuration is not set where the client runs", peer, problem.placeholder)
    else:
        refusals.log(log, logging.INFO, "refused requests (401)", peer,
                     "refused a request from %s (401): %s", peer, problem.log_description)


def _peer(scope: Scope) -> str:
    """The address a request came from ("unknown" when the server was not told)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


@dataclass(frozen=True)
class BodyTooLarge:
    """A request body over the limit: what it declared or what had arrived when it passed the limit."""

    size: int
    limit: int
    declared: bool  # the size is its Content-Length; otherwise the bytes read before the gate stopped

    @property
    def description(self) -> str:
        """The refusal in words: both sizes, and what to send instead."""
        size = f"is {self.size} bytes" if self.declared else f"passed {self.limit} bytes (chunked, {self.size} read)"
        return (f"the request body {size}, over the {self.limit} bytes ({self.limit >> 20} MiB) this kb-mcp server "
                f"reads in one request; a problem or candidate is at most {MAX_SOURCE_BYTES >> 20} MiB: "
                "send smaller sources")

    def body(self) -> bytes:
        """The JSON body of the 413, in the form of the gate's other refusals."""
        return json.dumps({"error": "request_too_large", "error_description": self.description}).encode()


async def _read_body(scope: Scope, receive: Callable[[], Awaitable[Message]],
                     limit: int) -> Callable[[], Awaitable[Message]] | BodyTooLarge:
    """Reads a request's body up to `limit` bytes and returns a `receive` that hands it to the app
    as it came, then whatever the client sends next (a disconnect); or BodyTooLarge, without reading
    further, once the declared length or the bytes that arrived pass the limit. The MCP app reads
    every body whole before parsing it anyway, so holding it here first costs no streaming."""
    declared = _header(scope, b"content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        return BodyTooLarge(int(declared), limit, declared=True)
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if size > limit:
            return BodyTooLarge(size, limit, declared=False)
        if not message.get("more_body", False):
            break
    pending = iter(messages)

    async def replay() -> Message:
        message = next(pending, None)
        return message if message is not None else await receive()

    return replay


def _principal(client: str) -> AuthenticatedUser:
    """`client` as the MCP SDK's authenticated user: its session manager then holds each session to
    the client that opened it, and answers any other client's request in it as for a session that does
    not exist (404). An Mcp-Session-Id that leaked (a log, a proxy) lets no other agent read its
    tasks' private text or cancel them. The token itself stays out of it."""
    return AuthenticatedUser(AccessToken(token="", client_id=client, scopes=[]))


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _send_json(
    send: Callable[[Message], Awaitable[None]], status: int, body: bytes | dict[str, Any],
    extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
