"""The worker channel: authenticated frames of protocol messages over a real socket pair."""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import time

import pytest

from kb_mcp.harness.protocol import FROM_WORKER, Phase
from kb_mcp.harness.sandbox.channel import (
    HEADER,
    MAX_FRAME,
    ChannelClosed,
    ForgedFrame,
    FrameReader,
    encode,
    new_key,
    send,
)


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_round_trip_keeps_order_and_content(pair) -> None:
    a, b = pair
    key = new_key()
    send(a, Phase(rid="r", seq=0, phase="é" * 10), key)
    send(a, Phase(rid="r", seq=1, phase="nan"), key)
    reader = FrameReader(b)
    assert reader.read_message(FROM_WORKER, key, time.monotonic() + 5) == Phase(rid="r", seq=0, phase="é" * 10)
    assert reader.read(key, time.monotonic() + 5) == {"kind": "phase", "rid": "r", "seq": 1, "phase": "nan"}
    assert not reader.pending()


def test_an_authentic_frame_that_is_no_message_is_forged(pair) -> None:
    a, b = pair
    key = new_key()
    send(a, Phase(rid="r", seq=0, phase="import"), key)
    body = b'{"kind":"result","rid":"r","seq":1,"body":{"kind":"verify","verdict":"faster"}}'
    a.sendall(HEADER.pack(len(body)) + body + hmac.new(key, body, hashlib.sha256).digest())
    reader = FrameReader(b)
    assert isinstance(reader.read_message(FROM_WORKER, key, time.monotonic() + 5), Phase)
    with pytest.raises(ForgedFrame, match="not a message of the harness"):
        reader.read_message(FROM_WORKER, key, time.monotonic() + 5)


def test_frame_signed_with_another_key_is_forged(pair) -> None:
    a, b = pair
    a.sendall(encode(Phase(rid="r", seq=0, phase="x"), new_key()))
    with pytest.raises(ForgedFrame, match="authentication"):
        FrameReader(b).read(new_key(), time.monotonic() + 5)


def test_unsigned_fake_result_is_forged(pair) -> None:
    # What a candidate writing to the socket would send: a plausible body and a made-up MAC.
    a, b = pair
    body = b'{"type":"result","verdict":"faster"}'
    a.sendall(struct.pack(">I", len(body)) + body + b"\0" * 32)
    with pytest.raises(ForgedFrame):
        FrameReader(b).read(new_key(), time.monotonic() + 5)


def test_oversized_length_is_rejected_without_reading_it(pair) -> None:
    a, b = pair
    a.sendall(HEADER.pack(MAX_FRAME + 1) + b"x" * 10)
    with pytest.raises(ForgedFrame, match="limit"):
        FrameReader(b).read(new_key(), time.monotonic() + 5)


def test_partial_frame_at_the_deadline_is_forged_not_a_timeout(pair) -> None:
    a, b = pair
    a.sendall(HEADER.pack(1000) + b"{")  # a length the sender never fills
    with pytest.raises(ForgedFrame, match="incomplete"):
        FrameReader(b).read(new_key(), time.monotonic() + 0.3)


def test_silence_is_a_timeout_and_close_is_closed(pair) -> None:
    a, b = pair
    reader = FrameReader(b)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        reader.read(new_key(), time.monotonic() + 0.2)
    assert 0.15 < time.monotonic() - t0 < 3
    a.close()
    with pytest.raises(ChannelClosed):
        reader.read(new_key(), time.monotonic() + 5)
