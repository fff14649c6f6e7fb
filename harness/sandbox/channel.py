"""The private channel between the worker pool and a worker process: length-prefixed JSON frames,
each authenticated with HMAC-SHA256, each one message of `harness.protocol`.

The channel is a socket pair, never stdout (which the candidate may flood or print fake results
to). Frames from the worker carry the request id and a sequence number and are signed with a key
the pool chose for that request, so a candidate that finds the socket and writes to it produces
frames that fail authentication or break the sequence: the pool reports `forged_result` instead of
believing them. (Code that reads the worker's memory could still learn the key; the integrity
checks for tampering and threads, and the pool's strict frame accounting, are the defence there.)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import select
import socket
import struct
import time
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

HEADER = struct.Struct(">I")
MAC_LEN = 32
MAX_FRAME = 64 << 20  # a result with logs is far smaller; anything larger is not ours
POOL_KEY = b"kb-mcp pool"  # frames from the pool: the worker cannot be written to by anyone else


class ChannelError(Exception):
    """The channel broke: the peer closed it, or sent bytes that are not a frame of ours."""


class ChannelClosed(ChannelError):
    """The peer closed the channel (for a worker: it exited or was killed)."""


class ForgedFrame(ChannelError):
    """A frame failed authentication, was malformed, or arrived out of sequence."""


def new_key() -> bytes:
    """A fresh random key for one request."""
    import os

    return os.urandom(32)


def encode(msg: BaseModel, key: bytes) -> bytes:
    """One frame: 4-byte big-endian length, JSON body, HMAC-SHA256 of the body."""
    # model_dump keeps NaN and infinities as floats; json writes them as NaN/Infinity and reads them back.
    body = json.dumps(msg.model_dump(mode="json"), separators=(",", ":"), allow_nan=True).encode()
    if len(body) > MAX_FRAME:
        raise ValueError(f"frame of {len(body)} bytes exceeds the channel's limit of {MAX_FRAME}")
    return HEADER.pack(len(body)) + body + hmac.new(key, body, hashlib.sha256).digest()


def send(sock: socket.socket, msg: BaseModel, key: bytes) -> None:
    """Writes one message as one frame (blocking until all of it is written)."""
    sock.sendall(encode(msg, key))


class FrameReader:
    """Reads frames from a socket with a deadline, keeping partial data between calls."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()

    def _fill(self, n: int, deadline: float | None) -> None:
        while len(self._buf) < n:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._wait(timeout):
                if self._buf:
                    # The harness writes whole frames at once; half a frame at the deadline was written
                    # by someone else (or with a length nobody will fill).
                    raise ForgedFrame(f"an incomplete frame ({len(self._buf)} of {n} bytes) sat on the channel")
                raise TimeoutError("no frame before the deadline")
            try:
                chunk = self.sock.recv(max(65536, n - len(self._buf)))
            except (ConnectionResetError, BrokenPipeError) as exc:
                raise ChannelClosed(f"the peer closed the channel ({exc.strerror})") from exc
            if not chunk:
                raise ChannelClosed("the peer closed the channel")
            self._buf += chunk

    def read(self, key: bytes, deadline: float | None = None) -> dict[str, Any]:
        """The next frame's JSON object; raises ForgedFrame if it is not authentic, TimeoutError
        at the deadline, ChannelClosed at end of stream."""
        self._fill(HEADER.size, deadline)
        (length,) = HEADER.unpack_from(self._buf)
        if length > MAX_FRAME:
            raise ForgedFrame(f"frame length {length} exceeds the channel's limit: not a frame of the harness")
        total = HEADER.size + length + MAC_LEN
        self._fill(total, deadline)
        body = bytes(self._buf[HEADER.size : HEADER.size + length])
        mac = bytes(self._buf[HEADER.size + length : total])
        del self._buf[:total]
        if not hmac.compare_digest(mac, hmac.new(key, body, hashlib.sha256).digest()):
            raise ForgedFrame("a frame on the result channel failed authentication")
        try:
            obj = json.loads(body)
        except ValueError as exc:
            raise ForgedFrame(f"an authenticated frame is not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise ForgedFrame("an authenticated frame is not a JSON object")
        return obj

    def read_message(self, adapter: TypeAdapter[Any], key: bytes, deadline: float | None = None) -> Any:
        """The next frame as one of the messages `adapter` accepts (`protocol.FROM_WORKER` or
        `protocol.TO_WORKER`); an authentic frame that is no such message is ForgedFrame too."""
        obj = self.read(key, deadline)
        try:
            return adapter.validate_python(obj)
        except ValidationError as exc:
            raise ForgedFrame(f"an authenticated frame is not a message of the harness: {_first_error(exc)}") from exc

    def _wait(self, timeout: float | None) -> bool:
        # poll, not select: the worker keeps its channel on a high descriptor number
        p = select.poll()
        p.register(self.sock.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
        return bool(p.poll(None if timeout is None else int(timeout * 1000)))

    def pending(self) -> bool:
        """True when bytes are waiting (buffered or on the socket) that no one has read yet."""
        return bool(self._buf) or self._wait(0)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg', '')}"
