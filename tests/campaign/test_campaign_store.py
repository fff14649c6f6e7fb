"""A campaign folder's records (campaign.store): written whole, and a record damaged after it was
written is the environment's fault, named with its path and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.campaign.models import KBSnapshot, Retry
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.kb.errors import EnvironmentFault


def _snapshot() -> KBSnapshot:
    return KBSnapshot(states=1, discovered_states=0, optimizations=2, deprecated_optimizations=0, lessons=0,
                      outcomes=0, measured_scores=0, bytes=10)


@pytest.mark.parametrize("damage", [b"", b'{"states": 1', b"\xff\xfe", b'{"states": "many"}'])
def test_a_record_damaged_after_it_was_written_is_the_environments_fault(tmp_path: Path, damage: bytes) -> None:
    store = CampaignStore(tmp_path)
    store.write_kb_start(_snapshot())
    store.write_retried([Retry(problem="p", candidate_id="c_1", deaths=1)])
    for path, read in ((tmp_path / "raw" / "kb_start.json", store.kb_start),
                       (tmp_path / "raw" / "retried" / "run001.json", store.retried)):
        path.write_bytes(damage)  # a hand edit or a damaged disk: the store itself writes whole files only
        with pytest.raises(EnvironmentFault) as err:
            read()
        assert err.value.whose == "environment" and err.value.where == str(path)
        assert str(path) in err.value.message and err.value.action and f"mv {path}" in err.value.action

