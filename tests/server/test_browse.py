"""Browsing the KB: `kb-mcp kb states|candidates|candidate|outcomes|campaigns|stats` (tables and
--json) and the same documents as MCP resources through a real stdio client, with -32002 for an
id the KB does not hold (handshake-era protocol) and completions for the templates' ids."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import ResourceTemplateReference

from kb_mcp.campaign.models import CampaignConfig, CampaignStatus
from kb_mcp.clients.mcp_client import stdio_params
from kb_mcp.kb import paths
from kb_mcp.kb.models import CandidateRecord, Outcome, Verdict
from kb_mcp.kb.store import KBStore

STATE = "memory_bandwidth_saturated"
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)
# a lineage: c_root -> (fuse) c_mid -> (vectorize) c_leaf, plus a failed sibling of c_mid
CANDIDATES = [
    ("c_root000000000001", Verdict.slower, 0.8, None, None),
    ("c_mid0000000000002", Verdict.faster, 1.9, "c_root000000000001", "fuse_elementwise_chain"),
    ("c_leaf000000000003", Verdict.faster, 2.6, "c_mid0000000000002", "vectorize_global_access"),
    ("c_bad0000000000004", Verdict.incorrect, None, "c_root000000000001", "grid_stride_ilp"),
]
# c_leaf measured faster and tried to reach the network: valid, flagged, never credited
ATTEMPT = ("the candidate tried what the sandbox refuses: network: connect 1.1.1.1:443 (worker). Nothing of it "
           "reached outside the sandbox; remove it from the candidate")


def _seed(kb: Path) -> None:
    store = KBStore.open(kb)
    folder = paths.artifacts_dir(kb) / "candidates"
    folder.mkdir(parents=True)
    with store.transaction() as tx:
        for i, (cid, verdict, speedup, parent, opt) in enumerate(CANDIDATES):
            when = T0 + timedelta(minutes=i)
            tried = cid == "c_leaf000000000003"
            tx.put_candidate(CandidateRecord(candidate_id=cid, problem="swish", problem_hash="h", verdict=verdict,
                                             device="NVIDIA H100", arch="sm_90", time_ms=0.1 if speedup else None,
                                             speedup_vs_baseline=speedup, created_at=when, flagged=tried,
                                             findings=["sandbox_attempt"] if tried else [],
                                             attempt=ATTEMPT if tried else ""))
            if parent is not None:
                tx.put_outcome(Outcome(id=f"o{i}", problem="swish", candidate_id=cid, parent_candidate_id=parent,
                                       state_id=STATE, optimization_id=opt, arch="sm_90", verdict=verdict,
                                       speedup=speedup, analysis=f"step {i}", agent="tester", created_at=when))
            (folder / f"{cid}.py").write_text(f"# candidate {cid}\nclass ModelNew:\n    pass\n")
    header = paths.artifacts_dir(kb) / "campaigns" / "overnight" / "campaign.json"
    header.parent.mkdir(parents=True)
    header.write_text(CampaignStatus(config=CampaignConfig(problems=["/p/swish.py", "/p/gemm.py"]), kb_path=str(kb),
                                     state="stopped", runs=2).model_dump_json())


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("browse") / "kb.json"
    _seed(path)
    return path


def _kb(kb: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb), "kb", *args],
                          capture_output=True, text=True, timeout=120)


def test_candidates_newest_first_with_filters(kb: Path) -> None:
    doc = json.loads(_kb(kb, "candidates", "--json").stdout)
    assert doc["count"] == 4
    assert [c["candidate_id"] for c in doc["candidates"]] == [c[0] for c in reversed(CANDIDATES)]
    faster = json.loads(_kb(kb, "candidates", "--verdict", "faster", "--json").stdout)
    assert {c["candidate_id"] for c in faster["candidates"]} == {"c_mid0000000000002", "c_leaf000000000003"}
    table = _kb(kb, "candidates").stdout
    assert "c_leaf000000000003" in table and "x2.60" in table


def test_flagged_candidates_are_listed_with_what_they_tried(kb: Path) -> None:
    doc = json.loads(_kb(kb, "candidates", "--flagged", "--json").stdout)
    assert doc["count"] == 1 and len(doc["candidates"]) == 1
    leaf = doc["candidates"][0]
    assert (leaf["candidate_id"], leaf["verdict"], leaf["flagged"]) == ("c_leaf000000000003", "faster", True)
    assert leaf["findings"] == ["sandbox_attempt"] and leaf["attempt"] == ATTEMPT
    table = _kb(kb, "candidates", "--flagged", "--limit", "5").stdout
    assert "faster (flagged)" in table and "c_mid0000000000002" not in table
    assert "sandbox_attempt: the candidate tried what the sandbox refuses: network: connect 1.1.1.1:443" in \
        " ".join(table.split()), table
    assert "sandbox_attempt: the candidate tried" in _kb(kb, "candidate", "c_leaf", "--no-source").stdout


def test_a_candidate_by_prefix_shows_verdict_source_and_lineage(kb: Path) -> None:
    shown = _kb(kb, "candidate", "c_leaf")
    assert shown.returncode == 0, shown.stderr
    assert "verdict faster" in shown.stdout
    assert "c_root000000000001 x0.80 -> [fuse_elementwise_chain] c_mid0000000000002 x1.90 -> " \
           "[vectorize_global_access] c_leaf000000000003 x2.60" in shown.stdout
    assert "# candidate c_leaf000000000003" in shown.stdout
    doc = json.loads(_kb(kb, "candidate", "c_mid", "--json").stdout)
    assert [(a["candidate_id"], a.get("optimization_id")) for a in doc["lineage"]] == [
        ("c_root000000000001", None), ("c_mid0000000000002", "fuse_elementwise_chain")]
    assert [c["candidate_id"] for c in doc["children"]] == ["c_leaf000000000003"]
    assert doc["source"].startswith("# candidate c_mid") and doc["record"]["verdict"] == "faster"


def test_an_unknown_or_ambiguous_candidate_is_refused(kb: Path) -> None:
    missing = _kb(kb, "candidate", "c_nope")
    assert missing.returncode == 1 and f"kb-mcp --kb {kb} kb candidates" in missing.stderr
    ambiguous = _kb(kb, "candidate", "c_")
    assert ambiguous.returncode == 1 and "names 4 candidates" in ambiguous.stderr


def test_outcomes_states_campaigns_and_stats(kb: Path) -> None:
    outcomes = json.loads(_kb(kb, "outcomes", "--state", STATE, "--json").stdout)
    assert [o["candidate_id"] for o in outcomes["outcomes"]] == ["c_bad0000000000004", "c_leaf000000000003",
                                                                 "c_mid0000000000002"]
    assert json.loads(_kb(kb, "outcomes", "--state", "tensor_core_bound", "--json").stdout)["count"] == 0
    states = json.loads(_kb(kb, "states", "--json").stdout)
    assert next(s for s in states["states"] if s["id"] == STATE)["outcomes"] == 3
    assert STATE in _kb(kb, "states").stdout
    campaigns = json.loads(_kb(kb, "campaigns", "--json").stdout)["campaigns"]
    assert [(c["name"], c["state"], c["problems"], c["runs"]) for c in campaigns] == [("overnight", "stopped", 2, 2)]
    stats = json.loads(_kb(kb, "stats", "--json").stdout)
    assert stats["kb_path"] == str(kb) and stats["stats"]["candidates"] == 4


async def test_the_same_documents_are_resources(kb: Path) -> None:
    async with Client(stdio_params(kb)) as client:
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert {"kb://state/{state_id}", "kb://candidate/{candidate_id}"} <= templates
        listed = {str(r.uri) for r in (await client.list_resources()).resources}
        assert {"kb://candidates", "kb://outcomes", "kb://campaigns", "kb://states", "kb://stats"} <= listed
        read = await client.read_resource("kb://candidate/c_mid0000000000002")
        doc = json.loads(read.contents[0].text)  # type: ignore[union-attr]
        assert doc == json.loads(_kb(kb, "candidate", "c_mid0000000000002", "--json").stdout)
        listing = json.loads((await client.read_resource("kb://candidates")).contents[0].text)  # type: ignore[union-attr]
        shown = {c["candidate_id"]: c for c in listing["candidates"]}
        assert shown["c_leaf000000000003"]["flagged"] and shown["c_leaf000000000003"]["attempt"] == ATTEMPT
        assert not shown["c_mid0000000000002"]["flagged"] and "attempt" not in shown["c_mid0000000000002"]
        campaigns = json.loads((await client.read_resource("kb://campaigns")).contents[0].text)  # type: ignore[union-attr]
        assert campaigns["campaigns"][0]["name"] == "overnight"


async def test_a_kb_damaged_while_serving_is_worded_by_every_resource_that_reads_it(tmp_path: Path) -> None:
    kb = tmp_path / "kb.json"
    _seed(kb)
    journal = Path(str(kb) + ".journal")
    async with Client(stdio_params(kb)) as client:
        # another writer's damaged line, followed by a valid one: corruption, not a torn end
        lines = journal.read_bytes().splitlines(keepends=True)
        bad = bytearray(lines[0])
        bad[30] ^= 0x01
        with journal.open("ab") as f:
            f.write(bytes(bad) + lines[0])
        for uri in ("kb://states", "kb://stats", "kb://candidates", "kb://candidate/c_mid0000000000002",
                    "kb://outcomes"):
            with pytest.raises(MCPError) as err:
                await client.read_resource(uri)
            assert "the KB cannot be read (environment's to fix)" in err.value.error.message, (uri, err.value.error)
            assert str(journal) in err.value.error.message


@pytest.mark.parametrize(("mode", "code"), [("legacy", -32002), ("auto", -32602)])
async def test_a_missing_resource_has_its_protocol_versions_code(kb: Path, mode: str, code: int) -> None:
    # -32002 up to protocol 2025-11-25; 2026-07-28 retired it for -32602 (SEP-2164)
    async with Client(stdio_params(kb), mode=mode) as client:
        for uri in ("kb://state/no_such_state", "kb://candidate/c_nope"):
            with pytest.raises(MCPError) as err:
                await client.read_resource(uri)
            assert err.value.error.code == code, (client.protocol_version, err.value.error)
            assert "no " in err.value.error.message


async def test_ids_complete(kb: Path) -> None:
    async with Client(stdio_params(kb), mode="legacy") as client:
        assert client.server_capabilities.completions is not None
        states = await client.complete(ResourceTemplateReference(uri="kb://state/{state_id}"),
                                       {"name": "state_id", "value": "memory_"})
        assert STATE in states.completion.values
        assert all(v.startswith("memory_") for v in states.completion.values)
        cands = await client.complete(ResourceTemplateReference(uri="kb://candidate/{candidate_id}"),
                                      {"name": "candidate_id", "value": "c_l"})
        assert cands.completion.values == ["c_leaf000000000003"]


def test_the_commands_a_listing_suggests_keep_the_kb_it_was_given(kb: Path) -> None:
    assert f"kb-mcp --kb {kb} kb show STATE" in _kb(kb, "states").stdout
    assert f"kb-mcp --kb {kb} kb candidate ID" in _kb(kb, "candidates").stdout
