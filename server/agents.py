"""The agents of a shared HTTP server, told apart by a bearer token each.

Every client of `kb-mcp serve --http --token-file F` sends the same token, so the server cannot tell
them apart: to the KB they are one client (SHARED_CLIENT), who may record any of their candidates and
whose outcomes are bounded together. An agents file gives each agent a token of its own, one per line:

    # NAME     TOKEN
    alice      3q2Yw...   (at least MIN_TOKEN_CHARS characters)
    ci-bot     Zx9Lk...

A request carrying one of these tokens is that agent's (`agent:alice`): it alone is the verifier of
the candidates it verifies, its outcomes weigh as one client's, its lessons carry its name, and its
jobs count towards its own cap whatever session or protocol it uses. The shared token, where one is
given too, stays the shared client's. The file is the operator's: every mistake in it stops the
server with the line it is on (and never the token's text).
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from kb_mcp.kb.errors import Fault, names_no_file
from kb_mcp.server.env import ENV_AGENTS, ENV_TOKEN

__all__ = [
    "AGENT_PREFIX",
    "CLIENT_SCOPE_KEY",
    "MIN_TOKEN_CHARS",
    "PLACEHOLDER",
    "SHARED_CLIENT",
    "Agent",
    "AgentsFile",
    "AgentsFileError",
    "Credentials",
    "parse_agents",
    "read_agents",
    "unsendable",
]

log = logging.getLogger(__name__)

class AgentsFileError(ValueError):
    """An agents file that cannot be used; `whose` says who fixes it: the caller (a path that names
    no file, a file that is no agents file) or the environment (permissions, a failing disk)."""

    def __init__(self, message: str, *, whose: Fault = "caller") -> None:
        super().__init__(message)
        self.whose: Fault = whose

MIN_TOKEN_CHARS = 16
SHARED_CLIENT = "mcp-http"
"""Who every client of the shared token (and of a loopback server without one) is to the KB."""
AGENT_PREFIX = "agent:"
"""An agent's name in the KB: apart from the names local clients give themselves (`cli`, a stdio
client's own name), so no agent of the file can pass for one of them, nor one of them for an agent."""
CLIENT_SCOPE_KEY = "kb_mcp.client"
"""The ASGI scope key under which the HTTP gate (`transport.BearerGate`) names who sent a request it
let through; the gate removes whatever a request brought under it."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
PLACEHOLDER = re.compile(r"^\$(\{[A-Za-z_][\w:.-]*\}|[A-Za-z_]\w*)$")
"""`${KB_MCP_TOKEN}`, `$KB_MCP_TOKEN`, `${env:KB_MCP_TOKEN}`, `${input:kb-mcp-token}`: what a client
config holds before its variables are substituted; a template never filled in, not a token."""


def unsendable(token: str) -> str | None:
    """Why no client can send `token` as it is in an `Authorization: Bearer` header (None when one can):
    a header carries printable ASCII, so a token with any other character (a control character, a tab
    among them, or a letter outside ASCII) would be refused for every request, by the client that
    cannot encode it or by this server, which reads a header as Latin-1. The answer names the
    character, never the token."""
    bad = next((c for c in token if not " " <= c <= "~"), None)
    if bad is None:
        return None
    return (f"holds the character {bad!r} (U+{ord(bad):04X}), which no client can send in an HTTP header: a token "
            "is printable ASCII, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))'")


@dataclass(frozen=True)
class Agent:
    """One agent of the agents file: its name and its token (never shown)."""

    name: str
    token: str = field(repr=False)

    @property
    def client(self) -> str:
        """Who this agent is to the KB (its verdicts, outcomes, lessons and jobs)."""
        return f"{AGENT_PREFIX}{self.name}"


class AgentsFile:
    """An agents file, read again whenever it changes: an operator adds an agent, or revokes a token
    that leaked, without stopping the server (and the jobs it runs).

    The first read is the server's start, and a mistake stops it. A later change that cannot be used
    (a mistake in the file, the file gone) is logged with what is wrong, and until the file is right
    again no agent's token is accepted: a token the operator meant to revoke never outlives the edit
    that revoked it. The shared token is not in the file and keeps working.
    """

    def __init__(self, path: Path, shared: str | None = None) -> None:
        self.path = path
        self._shared = shared
        self._stamp = _stamp(path)
        self._agents = _read(path, shared)
        self.unusable = False
        """Whether the file's last change could not be used (no agent's token is accepted meanwhile):
        a refused agent is then told that the fault is the operator's, not its token's."""

    def agents(self) -> tuple[Agent, ...]:
        """The agents the file names now (none while it cannot be used)."""
        stamp = _stamp(self.path)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._agents = _read(self.path, self._shared)
                self.unusable = False
            except ValueError as exc:
                self._agents, self.unusable = (), True
                log.error("%s; no agent's token is accepted until the file is right again (the shared token "
                          "still is)", exc)
            else:
                log.info("the agents file %s changed: %d agents (%s)", self.path, len(self._agents),
                         ", ".join(a.name for a in self._agents))
        return self._agents


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file does (replaced, rewritten or resized); None when it is gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


@dataclass(frozen=True)
class Credentials:
    """The tokens an HTTP server accepts: the shared one, the agents file's, or none (a loopback
    server started without a token)."""

    shared: str | None = field(default=None, repr=False)
    agents_file: AgentsFile | None = None

    @property
    def required(self) -> bool:
        """Whether a request must carry one of these tokens (always, for a server started with an
        agents file, however many agents it names now)."""
        return self.shared is not None or self.agents_file is not None

    def client_of(self, presented: str) -> str | None:
        """Who a request carrying `presented` is (an agent's name, or SHARED_CLIENT), or None for a
        token of no one here. Every token is compared, each in constant time, so the answer's timing
        tells nothing of which one came close."""
        found: str | None = None
        given = presented.encode()
        agents = self.agents_file.agents() if self.agents_file is not None else ()
        for agent in agents:
            if hmac.compare_digest(given, agent.token.encode()):
                found = agent.client
        if self.shared is not None and hmac.compare_digest(given, self.shared.encode()):
            found = found or SHARED_CLIENT
        return found


def parse_agents(text: str, where: str, shared: str | None = None) -> tuple[Agent, ...]:
    """The agents of an agents file's text; raises ValueError naming `where` and the line for a
    malformed line, a bad or repeated name, a short, templated or repeated token, or a token that is
    also the shared one (whose requests could then not be told apart)."""
    agents: list[Agent] = []
    names: dict[str, int] = {}  # folded to lower case: names that differ only in case are one name
    tokens: dict[str, int] = {}
    # Lines end at "\n" only (a "\r" before it is stripped): the line numbers are those an editor shows,
    # and no other character (\x0b, \x85, U+2028 ...) can start a line of its own within one line.
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        at = f"{where} line {number}"
        fields = line.split()
        if len(fields) != 2:
            raise ValueError(f"{at}: expected 'NAME TOKEN' (two fields separated by spaces), found {len(fields)} "
                             "field(s)")
        name, token = fields
        if not _NAME.match(name):
            raise ValueError(f"{at}: the agent name {name[:60]!r} is not 1-40 letters, digits, '.', '_' or '-' "
                             "(starting with a letter or digit)")
        if name.lower() in names:
            raise ValueError(f"{at}: the agent {name!r} is already named on line {names[name.lower()]} (names that "
                             "differ only in case are one name: the KB's readers could not tell them apart)")
        if PLACEHOLDER.match(token):
            raise ValueError(f"{at}: {name}'s token is the unexpanded text {token!r}: write the token itself")
        why = unsendable(token)
        if why is not None:
            raise ValueError(f"{at}: {name}'s token {why}")
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(f"{at}: {name}'s token is too short ({len(token)} characters); use at least "
                             f"{MIN_TOKEN_CHARS}, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))'")
        if token in tokens:
            raise ValueError(f"{at}: {name}'s token is also the token on line {tokens[token]}: each agent needs "
                             "its own, or the server cannot tell them apart")
        if shared is not None and hmac.compare_digest(token.encode(), shared.encode()):
            raise ValueError(f"{at}: {name}'s token is the shared token (--token-file, ${ENV_TOKEN}): give the "
                             "agent a token of its own")
        names[name.lower()], tokens[token] = number, number
        agents.append(Agent(name, token))
    if not agents:
        raise ValueError(f"{where} names no agent: write one 'NAME TOKEN' line per agent")
    return tuple(agents)


def read_agents(path: str | None, shared: str | None = None) -> AgentsFile | None:
    """The agents file `path`, else the one $KB_MCP_AGENTS names, else None. Raises ValueError (the
    operator's to fix) where the file cannot be read or is not a valid agents file."""
    chosen = path or os.environ.get(ENV_AGENTS) or None
    if chosen is None:
        return None
    return AgentsFile(Path(chosen).expanduser(), shared)


def _read(where: Path, shared: str | None) -> tuple[Agent, ...]:
    """The agents of the file `where` (ValueError where it cannot be read or used); warns where users
    other than its owner may read it. Each token is registered as a secret: it is redacted from
    everything the server returns or stores."""
    from kb_mcp.tools.disclosure import register_secret

    text, mode = _text_of(where)
    try:
        agents = parse_agents(text, f"the agents file {where}", shared)
    except ValueError as exc:  # a file that is no agents file: the one who wrote it fixes it
        raise AgentsFileError(str(exc)) from exc
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning("the agents file %s may be read by other users of this machine, who could then act as any "
                    "agent in it: chmod 600 %s", where, where)
    for agent in agents:
        register_secret(agent.token)
    return agents


def _text_of(where: Path) -> tuple[str, int]:
    """The text and mode of the agents file `where`; ValueError where it is not a regular file (a
    folder, a pipe or a device, which would never end or never be the same twice: a pipe with no
    writer would hold the server's start, and every request after a change) or cannot be read."""
    try:
        # O_NONBLOCK: opening a pipe does not wait for a writer; a regular file reads as usual
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise AgentsFileError(f"cannot read the agents file {where}: {exc.strerror or exc}",
                              whose="caller" if names_no_file(exc) else "environment") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise AgentsFileError(f"the agents file {where} is not a regular file (a folder, a pipe or a device): "
                                  "name a file of 'NAME TOKEN' lines")
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read().decode("utf-8"), mode
    except OSError as exc:
        raise AgentsFileError(f"cannot read the agents file {where}: {exc.strerror or exc}",
                              whose="environment") from exc
    except UnicodeDecodeError as exc:
        raise AgentsFileError(f"cannot read the agents file {where}: it is not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start})") from exc
    finally:
        os.close(fd)
