"""Two server processes on one KB file (two agents, each starting its own `kb-mcp serve`): what
one records, the other sees and suggests from. And the team setup: one HTTP server, two clients."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path

from kbfacts import verified_candidate
from mcp import Client
from serverproc import http_server

from kb_mcp.clients.mcp_client import call_json, connect_http, stdio_params

STATE = "memory_bandwidth_saturated"


def _entry(suggested: dict, optimization_id: str) -> dict:
    return next(s for s in suggested["suggestions"] if s["id"] == optimization_id)


async def test_an_outcome_recorded_through_one_server_is_suggested_by_the_other(kb_path: Path) -> None:
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(Client(stdio_params(kb_path)))
        second = await stack.enter_async_context(Client(stdio_params(kb_path)))
        ask = {"state_id": STATE, "k": 10, "temperature": 0}
        before = await call_json(second, "suggest_optimizations", ask)
        opt = before["suggestions"][0]["id"]
        assert _entry(before, opt)["attempts"] == 0
        # compile_and_verify stored its verdict on a candidate (2x faster than eager)
        cid = verified_candidate(kb_path, "class ModelNew: pass  # shared\n", time_ms=0.5, eager_ms=1.0)
        recorded = await call_json(
            first, "record_outcome", {"state_id": STATE, "optimization_id": opt, "candidate_id": cid,
                                      "lesson": "one pass instead of three"},
        )
        assert recorded["score_moved"] and recorded["speedup"] == 2.0
        # the other server, which has read the KB before, sees the new outcome
        after = await call_json(second, "suggest_optimizations", ask)
        entry = _entry(after, opt)
        assert entry["attempts"] == 1 and entry["samples"] == 1
        assert entry["confidence"] > _entry(before, opt)["confidence"]  # now it rests on a measurement
        (lesson,) = entry["lessons"]  # with who recorded it and from which verified outcome
        assert lesson["text"] == "one pass instead of three" and lesson["outcome_id"] == recorded["outcome_id"]
        stats = json.loads((await second.read_resource("kb://stats")).contents[0].text)  # type: ignore[union-attr]
        assert stats["stats"]["outcomes"] == {"faster": 1}
        # recording it again through the other server changes nothing (idempotent per candidate)
        again = await call_json(second, "record_outcome", {"state_id": STATE, "optimization_id": opt,
                                                           "candidate_id": cid})
        assert again["recorded"] is False
        assert _entry(await call_json(first, "suggest_optimizations", ask), opt)["samples"] == 1


async def test_a_team_shares_one_http_server(kb_path: Path) -> None:
    token = "team-token-0123456789abcdef"
    token_file = kb_path.parent / "token"
    token_file.write_text(token)
    with http_server(kb_path, ["--http", "127.0.0.1:0", "--token-file", str(token_file)]) as server:
        async with connect_http(server.url, token) as alice, connect_http(server.url, token) as bob:
            cid = verified_candidate(kb_path, "class ModelNew: pass  # team\n", time_ms=0.4, eager_ms=1.0)
            opt = (await call_json(bob, "suggest_optimizations", {"state_id": STATE,
                                                                  "temperature": 0}))["suggestions"][0]["id"]
            await call_json(alice, "record_outcome", {"state_id": STATE, "optimization_id": opt, "candidate_id": cid})
            seen = await call_json(bob, "suggest_optimizations", {"state_id": STATE, "k": 10, "temperature": 0})
            assert _entry(seen, opt)["samples"] == 1
