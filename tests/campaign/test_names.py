"""campaign/names.py: a campaign's name decides its folder, always directly inside the campaigns
folder beside the KB (real folders and links)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.campaign.names import CampaignError, campaign_folder, eval_folder


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "-x", "a/b", ""])
def test_a_campaign_name_cannot_name_a_folder_outside_the_campaigns_folder(tmp_path: Path, name: str) -> None:
    with pytest.raises(CampaignError, match="starts with a letter or digit"):
        campaign_folder(tmp_path / "kb.json", name)
    assert campaign_folder(tmp_path / "kb.json", "night.2") == tmp_path / "kb.artifacts" / "campaigns" / "night.2"


def test_a_campaign_folder_that_links_elsewhere_is_refused(tmp_path: Path) -> None:
    campaigns = tmp_path / "kb.artifacts" / "campaigns"
    campaigns.mkdir(parents=True)
    (campaigns / "linked").symlink_to(tmp_path)
    with pytest.raises(CampaignError, match="not a link elsewhere"):
        campaign_folder(tmp_path / "kb.json", "linked")


@pytest.mark.parametrize("name", ["..", "../x", ".hidden", "a/b"])
def test_an_eval_name_cannot_name_a_folder_outside_the_evals_folder(tmp_path: Path, name: str) -> None:
    with pytest.raises(CampaignError, match="cannot name an eval: a name starts with a letter or digit"):
        eval_folder(tmp_path / "kb.json", name)
    assert eval_folder(tmp_path / "kb.json", "mine-1") == tmp_path / "kb.artifacts" / "evals" / "mine-1"
