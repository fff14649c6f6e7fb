"""The product tools through the SDK's in-memory client: every loaded tool answers bad arguments
with a clear `isError` and stays up; the KB tools work without a GPU; `record_outcome` moves scores
only on the server's stored verdict; the KB resources show what was recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kbfacts import outcome_count, pooled_score, verified_candidate
from mcp import Client

from kb_mcp.clients.mcp_client import ToolCallError, call_json
from kb_mcp.kb.models import Verdict
from kb_mcp.server.app import KbMcpServer, build_server
from kb_mcp.server.registry import TOOL_MODULES, load_tools
from kb_mcp.tools.context import ToolContext

STATE = "memory_bandwidth_saturated"


@pytest.fixture
def server(kb_path: Path) -> KbMcpServer:
    srv = build_server(ToolContext(kb_path, client_name="test-agent"))
    yield srv
    srv.jobs.shutdown()
    srv.kb_ctx.close()


def test_all_five_tools_are_served(server: KbMcpServer) -> None:
    names = [spec.name for spec in load_tools(strict=True)]
    assert names == [m.rsplit(".", 1)[1] for m in TOOL_MODULES]
    assert list(server.specs) == [*names, "start_job", "job_status", "cancel_job"]


@pytest.mark.parametrize("spec", load_tools(), ids=lambda s: s.name)
async def test_every_tool_rejects_bad_arguments_and_stays_up(server: KbMcpServer, spec) -> None:  # type: ignore[no-untyped-def]
    required = [name for name, field in spec.request.model_fields.items() if field.is_required()]
    async with Client(server) as client:
        missing = await client.call_tool(spec.name, {})  # every tool needs to be told something
        assert missing.is_error
        text = missing.content[0].text  # type: ignore[union-attr]
        assert f"invalid arguments for {spec.name}" in text
        for name in required:
            assert f"- {name}: required, but not given" in text
        bogus = await client.call_tool(spec.name, {"speedup": 40.0, **{name: {"not": "this"} for name in required}})
        assert bogus.is_error
        assert "- speedup: unknown argument (accepted: " in bogus.content[0].text  # type: ignore[union-attr]
        # still serving: a KB resource reads fine after the errors
        stats = json.loads((await client.read_resource("kb://stats")).contents[0].text)  # type: ignore[union-attr]
        assert stats["stats"]["schema_version"] >= 1


async def _suggest(client: Client, **extra: object) -> dict:
    return await call_json(client, "suggest_optimizations", {"state_id": STATE, "k": 10, "temperature": 0, **extra})


async def test_suggest_works_without_a_gpu_and_explains_unknown_states(server: KbMcpServer) -> None:
    async with Client(server) as client:
        got = await _suggest(client, k=2)
        assert got["state_id"] == STATE and 1 <= len(got["suggestions"]) <= 2
        with pytest.raises(ToolCallError, match="unknown state_id 'memory_bandwith_saturated'.*Did you mean"):
            await call_json(client, "suggest_optimizations", {"state_id": "memory_bandwith_saturated"})


async def test_record_outcome_refuses_unknown_candidates_and_changes_nothing(server: KbMcpServer,
                                                                             kb_path: Path) -> None:
    async with Client(server) as client:
        opt = (await _suggest(client))["suggestions"][0]["id"]
        before = pooled_score(kb_path, STATE, opt)
        with pytest.raises(ToolCallError, match="unknown candidate_id 'c_0000000000000000'.*compile_and_verify"):
            await call_json(
                client,
                "record_outcome",
                {"state_id": STATE, "optimization_id": opt, "candidate_id": "c_0000000000000000",
                 "analysis": "ran 10x faster on my machine"},
            )
    assert pooled_score(kb_path, STATE, opt) == before
    assert outcome_count(kb_path) == 0


async def test_a_reported_speedup_is_not_an_argument(server: KbMcpServer, kb_path: Path) -> None:
    cid = verified_candidate(kb_path, "class ModelNew: pass  # slow\n", verdict=Verdict.slower, time_ms=2.0)
    async with Client(server) as client:
        opt = (await _suggest(client))["suggestions"][0]["id"]
        before = pooled_score(kb_path, STATE, opt)
        result = await client.call_tool(
            "record_outcome",
            {"state_id": STATE, "optimization_id": opt, "candidate_id": cid, "speedup": 25.0},
        )
        assert result.is_error and "- speedup: unknown argument" in result.content[0].text  # type: ignore[union-attr]
        assert pooled_score(kb_path, STATE, opt) == before
        # the same outcome without the made-up number: the stored verdict (2x slower) is what counts
        got = await call_json(
            client,
            "record_outcome",
            {"state_id": STATE, "optimization_id": opt, "candidate_id": cid,
             "analysis": "I measured 25x faster myself"},
        )
    assert got["verdict"] == "slower" and got["speedup"] == pytest.approx(0.5)
    after = pooled_score(kb_path, STATE, opt)
    assert after is not None and after.samples == (before.samples if before else 0) + 1
    assert after.expected_speedup < (before.expected_speedup if before else 1.0)


async def test_a_flagged_candidate_moves_no_score(server: KbMcpServer, kb_path: Path) -> None:
    cid = verified_candidate(kb_path, "class ModelNew: pass  # too good\n", time_ms=0.001, flagged=True)
    async with Client(server) as client:
        opt = (await _suggest(client))["suggestions"][0]["id"]
        before = pooled_score(kb_path, STATE, opt)
        got = await call_json(client, "record_outcome", {"state_id": STATE, "optimization_id": opt,
                                                         "candidate_id": cid})
    assert got["score_moved"] is False
    assert pooled_score(kb_path, STATE, opt) == before
    assert outcome_count(kb_path) == 1  # kept in the replay buffer for review


async def test_resources_show_what_was_recorded(server: KbMcpServer, kb_path: Path) -> None:
    cid = verified_candidate(kb_path, "class ModelNew: pass  # fast\n", time_ms=0.25)
    async with Client(server) as client:
        opt = (await _suggest(client))["suggestions"][0]["id"]
        await call_json(
            client,
            "record_outcome",
            {"state_id": STATE, "optimization_id": opt, "candidate_id": cid, "lesson": "fusing saved a pass"},
        )
        states = json.loads((await client.read_resource("kb://states")).contents[0].text)  # type: ignore[union-attr]
        detail = json.loads((await client.read_resource(f"kb://state/{STATE}")).contents[0].text)  # type: ignore[union-attr]
        stats = json.loads((await client.read_resource("kb://stats")).contents[0].text)  # type: ignore[union-attr]
        with pytest.raises(Exception, match="no state 'nope'"):
            await client.read_resource("kb://state/nope")
    row = next(s for s in states["states"] if s["id"] == STATE)
    assert row["outcomes"] == 1 and row["bottleneck"] == "memory/dram_bandwidth"
    entry = next(o for o in detail["optimizations"] if o["optimization"]["id"] == opt)
    assert entry["score"]["samples"] == 1 and entry["expected_speedup"] > 1.0
    (lesson,) = entry["lessons"]  # quoted as untrusted KB content, with its author and outcome
    assert lesson.startswith("[untrusted KB content from agent") and lesson.endswith('"fusing saved a pass"')
    assert "untrusted KB content" in detail["kb_text_notice"]
    assert detail["outcomes"] == 1
    assert stats["stats"]["outcomes"] == {"faster": 1} and stats["kb_path"] == str(kb_path)


async def test_outcomes_carry_the_callers_name(server: KbMcpServer, kb_path: Path) -> None:
    from kb_mcp.kb.store import KBStore

    cid = verified_candidate(kb_path, "class ModelNew: pass  # named\n")
    async with Client(server) as client:
        opt = (await _suggest(client))["suggestions"][0]["id"]
        got = await call_json(client, "record_outcome", {"state_id": STATE, "optimization_id": opt,
                                                         "candidate_id": cid})
    outcome = KBStore.open(kb_path).get_outcome(got["outcome_id"])
    assert outcome is not None and outcome.agent == "test-agent"
