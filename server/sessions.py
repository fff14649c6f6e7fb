"""How many MCP sessions one client of an HTTP server may hold open at once.

A client of the handshake-era protocol opens a stateful session with each `initialize` it sends
without an Mcp-Session-Id. The MCP SDK's session manager refuses every new session, for all clients
alike, once `DEFAULT_MAX_SESSIONS` are open, and closes an idle one only after `SESSION_IDLE_S`: one
token opening sessions in a loop would lock every other agent out for half an hour. So each client
(the name its token proves: an agent of the agents file, or the shared token's client) may hold at
most `sessions_per_client()` sessions; its next one is refused (429) with the numbers and what to do,
and the other clients are not affected. The SDK's own limit is lifted where every session has such
an owner (`sdk_max_sessions`): the per-client limits bound the total.

The sessions open are read from the SDK's record of who opened each one (`StreamableHTTPSessionManager
._session_owners`, filled from the `user` the gate puts in the scope), not counted a second time: the
SDK drops a session from it however the session ends (a client's DELETE, the idle timeout, a crash,
the end of an opening request that failed, the server's shutdown), so there is no event to miss. That
record is private to the SDK (mcp 2.3 has no public one): `SessionCap` checks it is there when the
server starts, and the tests of this module fail if an SDK upgrade takes it away.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from mcp.server.streamable_http_manager import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_IDLE_TIMEOUT
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from kb_mcp.server.agents import SHARED_CLIENT
from kb_mcp.server.session_limit import DEFAULT_SESSIONS_PER_CLIENT, ENV_SESSIONS_PER_CLIENT, sessions_per_client

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

__all__ = [
    "DEFAULT_SESSIONS_PER_CLIENT",
    "ENV_SESSIONS_PER_CLIENT",
    "SESSION_IDLE_S",
    "SessionCap",
    "SessionCapReached",
    "opens_session",
    "sdk_max_sessions",
    "sessions_per_client",
]

SESSION_IDLE_S = DEFAULT_SESSION_IDLE_TIMEOUT
"""A session with no request in flight for this long is closed (the SDK's 30 minutes). Kept: a client
whose session closes must notice the 404 and open a new one, and an agent may think for many minutes
between two tool calls; with the per-client limit a long idle period costs only the client that left
its sessions open, so a shorter one would buy nothing for the others."""


def sdk_max_sessions(owned: bool) -> int | None:
    """The SDK manager's `max_sessions` for a server whose every session has an owner (`owned`: a token
    is required) or not. Owned: no limit of the SDK's, since its 503 names no one and would refuse fair
    clients once an unfair one filled it; the per-client limits bound the total instead. Not owned (a
    loopback server without a token, one user): the SDK's default."""
    return None if owned else DEFAULT_MAX_SESSIONS


def opens_session(scope: Mapping[str, Any]) -> bool:
    """Whether the SDK's session manager opens a new session for this request: one without an
    Mcp-Session-Id that it routes to its stateful (handshake-era) path, i.e. one without an
    MCP-Protocol-Version header or with a handshake-era one (`_handle_request` of mcp 2.3). A request
    of the sessionless protocol (a later version in that header) opens none, so it is never refused."""
    headers = {key.lower(): value for key, value in scope.get("headers", [])}
    if b"mcp-session-id" in headers:
        return False
    version = headers.get(b"mcp-protocol-version")
    return version is None or version.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS


@dataclass(frozen=True)
class SessionCapReached:
    """A client's new session refused: it holds `open` sessions (or is opening them), `limit` at most."""

    client: str
    open: int
    limit: int
    idle_s: float = SESSION_IDLE_S

    @property
    def description(self) -> str:
        """The refusal in words: whose it is, the numbers, and what to do."""
        shared = (" Every client of the shared token counts as this one client: give each agent a token of its own "
                  "(the server's agents file) to give it a limit of its own." if self.client == SHARED_CLIENT else "")
        return (f"{self.client} already has {self.open} MCP sessions open on this kb-mcp server, the most one client "
                f"may hold ({ENV_SESSIONS_PER_CLIENT}={self.limit}); no new one is opened for it until one ends. "
                "This is the client's to fix: end each session it no longer uses (an HTTP DELETE to the MCP endpoint "
                "with the session's Mcp-Session-Id header; an MCP client sends it when it closes), reuse the sessions "
                f"it has, or wait: a session with no request for {self.idle_s / 60:g} minutes is closed. Other clients "
                f"are not affected.{shared}")

    def body(self) -> bytes:
        """The JSON body of the 429, in the form of the gate's other refusals, with the numbers."""
        return json.dumps({"error": "too_many_sessions", "error_description": self.description,
                           "open_sessions": self.open, "limit": self.limit,
                           "idle_close_s": self.idle_s}).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Retry-After: when one of its sessions closes at the latest, if it sends nothing more in them."""
        return [(b"retry-after", str(round(self.idle_s)).encode())]


class SessionCap:
    """The per-client limit on open sessions, over the sessions an SDK session manager holds.

    `admit` is asked, before the SDK sees it, for each request that opens a session (`opens_session`);
    a request it admits counts as one of its client's sessions from then until its response starts
    (`Opening.started`), by which time the SDK has recorded the session it opened or refused it.
    Between the two a session is counted twice, so two openings at once near the limit may be
    refused one early, never admitted one too many.
    """

    def __init__(self, manager: object, limit: int) -> None:
        owners = getattr(manager, "_session_owners", None)
        if not isinstance(owners, dict):  # an SDK upgrade moved it: refuse to serve without the limit
            raise RuntimeError(
                f"the MCP SDK's session manager ({type(manager).__name__}) keeps no record of who opened each "
                "session (_session_owners): kb-mcp cannot limit the sessions of each client with this version of "
                "the mcp package (a kb-mcp bug: install the mcp version pyproject.toml names)")
        self._owners: dict[str, Any] = owners
        self.limit = limit
        self._opening: Counter[str] = Counter()

    def open_sessions(self, client: str) -> int:
        """The sessions `client` holds open in the SDK, and those it is opening."""
        held = sum(1 for owner in self._owners.values() if owner.get("client_id") == client)
        return held + self._opening[client]

    def admit(self, client: str) -> Opening | SessionCapReached:
        """An opening counted for `client` (end it with `Opening.started`), or why it is refused."""
        held = self.open_sessions(client)
        if held >= self.limit:
            return SessionCapReached(client, held, self.limit)
        self._opening[client] += 1  # no await since the count: two openings cannot both see room for one
        return Opening(self, client)

    def _started(self, client: str) -> None:
        self._opening[client] -= 1
        if self._opening[client] <= 0:
            del self._opening[client]


class Opening:
    """One admitted opening request, counted until its response starts or it ends without one."""

    def __init__(self, cap: SessionCap, client: str) -> None:
        self._cap = cap
        self._client: str | None = client

    def started(self) -> None:
        """The response started (the SDK has recorded or refused the session): stop counting it here.
        Called again, it does nothing."""
        if self._client is not None:
            self._cap._started(self._client)
            self._client = None

    def watch(self, send: Send) -> Send:
        """`send` that calls `started` as the response starts."""
        async def watched(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.started()
            await send(message)

        return watched
