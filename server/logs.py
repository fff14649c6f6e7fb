"""Logging for the CLI and the server: always to stderr.

On stdio, stdout is the MCP wire: one stray byte there corrupts the client's stream. Logging is
configured before the SDK's MCPServer configures its own (`logging.basicConfig`, then a no-op
because the root logger has a handler), so every record, ours, the SDK's and uvicorn's, goes to
stderr in one format.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass

from kb_mcp.harness.sandbox.attempts import Attempt, on_attempt

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time of the record (it may be replaced later)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure(level: str = "INFO") -> None:
    """Routes logging to stderr at `level`: one stderr handler on the root logger, added once."""
    root = logging.getLogger()
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(level.upper())
    # per-request lines of the HTTP stack at INFO would drown the server's own messages
    for noisy in ("httpx", "httpx2", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


@dataclass
class _Window:
    """One (kind, who)'s current window: when it opened, the lines let through, and those held back."""

    logger: logging.Logger
    level: int
    opened: float
    shown: int = 0
    held: int = 0


class Throttle:
    """Log lines that a client can cause once per request (a refused request, a sandbox attempt), at most
    `burst` per (kind, who) in each `window_s` seconds.

    A refused request costs a client almost nothing and never reaches the app: one sending them in a loop
    would otherwise write a line each to the operator's disk and bury every other client's lines. So the
    first `burst` lines of a (kind, who) in a window are written whole, the rest only counted, and one
    summary line ("... and 4,213 more like it from agent:alice in the last 60 s") is written when the
    window closes (by a sweeper thread, the next line of any kind, or `flush` at shutdown). `who` must be
    something the client cannot mint at will (the name its token proves, or its peer address; never a
    token): at most `max_keys` windows are open at once, and beyond them every new (kind, who) shares
    one window per kind (`OTHERS`), so neither memory nor lines grow with the number of senders.
    """

    OTHERS = "other senders"
    MAX_LINE_CHARS = 4000  # a header-borne text in a line (an unexpanded token) is cut beyond this

    def __init__(self, *, burst: int = 5, window_s: float = 60.0, max_keys: int = 256) -> None:
        self.burst = burst
        self.window_s = window_s
        self.max_keys = max_keys
        self._windows: dict[tuple[str, str], _Window] = {}  # in the order they opened
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None

    def __len__(self) -> int:
        """The windows open now (the memory it holds)."""
        return len(self._windows)

    def log(self, logger: logging.Logger, level: int, kind: str, who: str, msg: str, *args: object) -> None:
        """Writes `msg % args` to `logger` unless `who` has had `burst` lines of `kind` in this window;
        counts it then. Never raises for a line it cannot write (logging's own rule)."""
        now = time.monotonic()
        with self._lock:
            closed = self._close(now)
            key = (kind, who)
            if key not in self._windows and len(self._windows) >= self.max_keys:
                key = (kind, self.OTHERS)  # one more window per kind at most: kinds are ours, not the client's
            window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = _Window(logger, level, now)
                self._start_sweeper()
            shown = window.shown < self.burst
            if shown:
                window.shown += 1
            else:
                window.held += 1
        self._summarize(closed, now)
        if shown:
            text = msg % args if args else msg
            if len(text) > self.MAX_LINE_CHARS:
                text = f"{text[:self.MAX_LINE_CHARS]}... ({len(text) - self.MAX_LINE_CHARS} more characters)"
            logger.log(level, "%s", text)

    def flush(self) -> None:
        """Closes every window now, writing the summary of each that held lines back (at shutdown)."""
        now = time.monotonic()
        with self._lock:
            closed = self._close(now, every=True)
        self._summarize(closed, now)

    def _close(self, now: float, every: bool = False) -> list[tuple[tuple[str, str], _Window]]:
        """Removes the windows that have closed (all with `every`); the caller holds the lock."""
        closed = []
        while self._windows:
            key, window = next(iter(self._windows.items()))
            if not every and now - window.opened < self.window_s:
                break  # they opened in order: the rest are younger
            closed.append((key, self._windows.pop(key)))
        return closed

    def _summarize(self, closed: list[tuple[tuple[str, str], _Window]], now: float) -> None:
        for (kind, who), window in closed:
            if window.held:
                seconds = min(now - window.opened, self.window_s)
                window.logger.log(window.level, "%s: ... and %s more like it from %s in the last %.0f s",
                                  kind, f"{window.held:,}", who, seconds)

    def _start_sweeper(self) -> None:
        """Starts the thread that closes windows on time, unless it runs; the caller holds the lock."""
        if self._sweeper is None:
            self._sweeper = threading.Thread(target=self._sweep, name="kb-mcp log throttle", daemon=True)
            self._sweeper.start()

    def _sweep(self) -> None:
        while True:
            with self._lock:
                if not self._windows:
                    self._sweeper = None  # the next window starts a new one
                    return
                first = next(iter(self._windows.values()))
                wait = first.opened + self.window_s - time.monotonic()
                closed = self._close(time.monotonic()) if wait <= 0 else []
            self._summarize(closed, time.monotonic())
            if wait > 0:
                time.sleep(wait)


refusals = Throttle()
"""The server's one throttle for per-request lines: the HTTP gate's refusals, sandbox attempts, a tool's
environment faults. `kb-mcp serve` flushes it as it stops."""

_attempts_log = logging.getLogger("kb_mcp.attempts")


def _log_attempt(attempt: Attempt, clients: str) -> None:
    who = clients or "an unnamed client"
    refusals.log(_attempts_log, logging.WARNING, f"sandbox attempts ({attempt.kind})", who,
                 "sandbox attempt by %s: %s", who, attempt.line())


def log_attempts() -> None:
    """Logs every attempt a sandboxed process makes (`harness.sandbox.attempts`) with the name of the client
    whose work it was: the owner of a shared server sees who tried what."""
    on_attempt(_log_attempt)
