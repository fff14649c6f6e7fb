"""What names a campaign, and where the campaign of a name lives: the one rule for the CLI
(`kb-mcp run-campaign --name`, `kb-mcp eval --name`) and the MCP job (`run_campaign`'s `name`). Light on purpose: the
CLI reads it at start-up."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from kb_mcp.kb import paths

if TYPE_CHECKING:  # kb.errors builds a pydantic model, which the CLI's start-up need not pay for
    from kb_mcp.kb.errors import Fault

CAMPAIGN_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""A letter or digit first, so '.', '..' and hidden names cannot name the campaigns folder, its
parent, or a folder the campaign views skip."""
DEFAULT_CAMPAIGN_NAME = "campaign"


class CampaignError(RuntimeError):
    """A campaign folder that cannot be used as asked; the message says what to do, and `whose`
    who can do it (the caller by default; "usage" for an option no run could use, "environment"
    for the machine's), which the CLI's exit status follows."""

    def __init__(self, message: str, *, whose: Fault = "caller") -> None:
        super().__init__(message)
        self.whose: Fault = whose


def campaign_folder(kb_path: Path, name: str) -> Path:
    """The folder of the campaign `name` beside the KB at `kb_path`: `<artifacts>/campaigns/<name>`.

    A name that is not `CAMPAIGN_NAME`, or whose folder resolves anywhere but directly inside the
    campaigns folder (a symbolic link), is refused with CampaignError.
    """
    return _named_folder(paths.artifacts_dir(kb_path) / "campaigns", name, "a campaign")


def eval_folder(kb_path: Path, name: str) -> Path:
    """The folder of the eval `name` (`kb-mcp eval --name`) beside the KB at `kb_path`:
    `<artifacts>/evals/<name>`, by the same rule as a campaign's (an eval's folder is a campaign folder)."""
    return _named_folder(paths.artifacts_dir(kb_path) / "evals", name, "an eval")


def _named_folder(root: Path, name: str, what: str) -> Path:
    folder = root / name
    if not re.fullmatch(CAMPAIGN_NAME, name) or folder.resolve().parent != root.resolve():
        raise CampaignError(f"{name!r} cannot name {what}: a name starts with a letter or digit, then letters, "
                            f"digits, '_', '.' or '-', and its folder is directly inside {root} (not a link "
                            "elsewhere); choose another name", whose="usage")
    return folder
