"""campaign/store.py: what a folder keeps of the verifications its runs re-ran on a cluster, read back
by every later report (real files, the report built from them); a record damaged after it was written
is the environment's fault, named with its path and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.campaign.models import CampaignConfig, CampaignStatus, KBSnapshot, Retry
from kb_mcp.campaign.names import CampaignError
from kb_mcp.campaign.report import report_from_store
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.kb.errors import EnvironmentFault


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


def test_a_record_that_cannot_be_read_is_the_environments_fault_with_its_path(tmp_path: Path) -> None:
    store = _store(tmp_path)
    step = store.root / "raw" / "steps" / "swish" / "i000_s000.json"
    step.parent.mkdir(parents=True)
    step.symlink_to(tmp_path / "gone.json")  # listed by the folder, but nothing to read
    with pytest.raises(EnvironmentFault) as raised:
        store.steps()
    assert raised.value.where == str(step) and f"mv {step}" in str(raised.value)
    store.status_path.unlink()
    store.status_path.mkdir()  # a folder where the header should be
    with pytest.raises(EnvironmentFault) as raised:
        store.read_status()
    assert raised.value.where == str(store.status_path)


def test_a_missing_kernel_source_is_the_environments_with_the_way_back(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save_kernel("swish", "c_1", "print('kernel')\n")
    assert store.kernel_source("swish", "c_1") == "print('kernel')\n"
    store.kernel_path("swish", "c_1").unlink()
    with pytest.raises(CampaignError) as raised:
        store.kernel_source("swish", "c_1")
    assert raised.value.whose == "environment"
    assert str(store.root / "kernels") in str(raised.value) and "in a new folder" in str(raised.value)
