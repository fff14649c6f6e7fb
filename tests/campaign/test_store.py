"""campaign/store.py: what a folder keeps of the verifications its runs re-ran on a cluster, read back
by every later report (real files, the report built from them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.campaign.models import CampaignConfig, CampaignStatus, Retry
from kb_mcp.campaign.report import report_from_store
from kb_mcp.campaign.store import CampaignError, CampaignStore


def _store(tmp_path: Path) -> CampaignStore:
    store = CampaignStore(tmp_path / "camp")
    config = CampaignConfig(problems=[str(tmp_path / "swish.py")], iterations=1, steps=1, models={})
    store.write_status(CampaignStatus(config=config, kb_path=str(tmp_path / "kb.json"), runs=2))
    return store


def _started(store: CampaignStore, run: int) -> None:
    status = store.read_status()
    assert status is not None
    store.write_status(status.model_copy(update={"runs": run}))


def test_each_runs_retries_are_kept_and_the_report_lists_them_all(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store.retried() == [] and "re-run" not in " ".join(report_from_store(store).notes)
    for run, retried in enumerate([[Retry(problem="swish", candidate_id="a", deaths=1)],
                                   [],  # a run that re-ran nothing leaves no file
                                   [Retry(problem="softmax", candidate_id="b", deaths=0, withdrawn=["gpu-1"])]], 1):
        _started(store, run)
        store.write_retried(retried)  # under the run number of the folder's header
    assert sorted(p.name for p in (store.root / "raw" / "retried").iterdir()) == ["run001.json", "run003.json"]
    assert [r.problem for r in store.retried()] == ["swish", "softmax"]  # run by run
    notes = " ".join(report_from_store(store).notes)
    assert "1 verification(s) re-run on another worker after theirs died: swish" in notes
    assert "withdrawn (gpu-1): softmax" in notes


def test_a_damaged_retry_file_is_named_not_skipped(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _started(store, 1)
    store.write_retried([Retry(problem="swish", candidate_id="a", deaths=1)])
    damaged = store.root / "raw" / "retried" / "run001.json"
    damaged.write_text('[{"problem": "swish"')
    with pytest.raises(CampaignError, match="run001.json is not a valid list of Retry records"):
        store.retried()
