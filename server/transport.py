"""Serving over streamable HTTP: where to bind, who may connect, and the bearer token.

Rules (from the product design):
* bound to loopback, a token is optional (if given, it is enforced);
* bound to anything else, a token is required: without one the server refuses to start;
* DNS-rebinding protection stays on with an explicit allow-list of Host names: loopback names
  for a loopback bind, the bound address plus every `--allow-host` otherwise. A wildcard bind
  (0.0.0.0, ::) has no name of its own, so it needs `--allow-host`.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import TransportSecuritySettings

from kb_mcp.server.env import ENV_TOKEN

log = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16
MCP_PATH = "/mcp"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


class ServeError(ValueError):
    """A serve configuration that must not start; the message says how to fix it."""


@dataclass(frozen=True)
class HttpOptions:
    """A validated HTTP serve configuration."""

    host: str  # as bound (IPv6 without brackets)
    port: int
    token: str | None
    allowed_hosts: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)

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


def http_options(bind: str, token: str | None, allow_hosts: Sequence[str] = ()) -> HttpOptions:
    """Validates a serve configuration; raises ServeError with the fix when it must not start."""
    host, port = parse_bind(bind)
    token = token or None
    loopback = is_loopback(host)
    if not loopback:
        if token is None:
            raise ServeError(
                f"refusing to serve on {host} without a bearer token: anyone who can reach this port could "
                f"run code on its GPU and write to the KB. Set {ENV_TOKEN} (or pass --token-file PATH), e.g.\n"
                f"  export {ENV_TOKEN}=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        if len(token) < MIN_TOKEN_CHARS:
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
    return HttpOptions(host, port, token, allowed_hosts, allowed_origins)


class StaticTokenVerifier:
    """The SDK's TokenVerifier for one shared secret (compared in constant time)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        """An AccessToken for the right secret, None (so: 401) for anything else."""
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token=token, client_id="kb-mcp-bearer", scopes=[])
        return None


def check_bindable(host: str, port: int) -> None:
    """Raises ServeError now, with the reason, if (host, port) cannot be bound (e.g. already in use)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ServeError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from exc


async def serve_http(app: object, options: HttpOptions, on_ready: Callable[[int], None]) -> None:
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
