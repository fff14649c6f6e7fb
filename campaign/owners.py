"""Whose a campaign folder is, and how many finished ones each client of a server keeps.

A campaign started through a server (`start_job(kind="run_campaign")`, `campaign.job`) is its
client's: its header names the client (`CampaignStatus.client`) from the run that made the folder,
and only that client may run the folder again (`may_run`). Another client naming it is refused, the
caller's error, so no client resumes, extends or reconfigures another's campaign, nor one the
operator started from the shell (`kb-mcp run-campaign`: `client` None). The operator may run any
folder from the shell; a resume keeps the folder's owner.

Each client keeps the folders of its newest `campaigns_kept_per_client()` finished campaigns: when
one of its campaigns ends, the older ones go (`trim`). A folder whose lock is held (a run in
progress, by any server or shell on the KB) is never removed, nor another client's, nor the
operator's, nor one whose header cannot be read (whose it is cannot be told). The KB needs no
campaign file: outcomes and lessons cite candidate ids, whose sources and verdicts the candidate
store keeps under its own bound (`tools.candidate_store`); a campaign's `kernels/` are copies.
Without the bound, one client starting campaigns one after another left a folder of each for ever
(about 190 KB for one problem and two steps, 130 KB of it plots; more with every step).
"""

from __future__ import annotations

import logging
import secrets
import shutil
from pathlib import Path

from kb_mcp.campaign.models import CampaignStatus
from kb_mcp.campaign.names import CampaignError
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.kb import settings
from kb_mcp.kb.errors import KbMcpError

__all__ = ["CAMPAIGNS_KEPT_PER_CLIENT", "ENV_CAMPAIGNS_KEPT_PER_CLIENT", "campaigns_kept_per_client", "may_run",
           "trim"]

log = logging.getLogger(__name__)

CAMPAIGNS_KEPT_PER_CLIENT = 10
"""Finished campaign folders one client keeps (records, kernels, report and plots of each)."""
ENV_CAMPAIGNS_KEPT_PER_CLIENT = "KB_MCP_CAMPAIGNS_KEPT_PER_CLIENT"
_REMOVING = ".removing-"  # a folder on its way out: hidden, so no campaign name can reach it


def campaigns_kept_per_client() -> int:
    """How many finished campaign folders each client keeps (``KB_MCP_CAMPAIGNS_KEPT_PER_CLIENT``,
    default CAMPAIGNS_KEPT_PER_CLIENT); SettingError for a value that is not a whole number of 1 or
    more (0 would remove a campaign's report before its client could read it)."""
    return settings.count(ENV_CAMPAIGNS_KEPT_PER_CLIENT, CAMPAIGNS_KEPT_PER_CLIENT, positive=True)


def may_run(status: CampaignStatus, client: str | None, folder: Path) -> None:
    """Refuses (CampaignError, the caller's) a server client's run of a folder that another client,
    or the operator from the shell, started; `client` None (the shell) may run any folder."""
    if client is None or status.client == client:
        return
    who = "the server's operator (kb-mcp run-campaign)" if status.client is None else "another client"
    raise CampaignError(f"the campaign {folder.name!r} was started by {who}: a client runs and resumes only the "
                        "campaigns it started; choose another name")


def trim(root: Path, client: str, keep: int) -> list[str]:
    """Removes the folders of `client`'s finished campaigns in `root` (the campaigns folder) beyond its
    newest `keep` (by last update); a folder being run is neither counted nor removed. Returns the
    names removed. Raises OSError where a folder cannot be moved away."""
    _clear_removed(root)
    mine: list[tuple[float, Path]] = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        status = _header(folder)
        if status is not None and status.client == client:
            mine.append((status.updated_at.timestamp(), folder))
    removed, kept = [], 0
    for _, folder in sorted(mine, key=lambda m: m[0], reverse=True):  # newest first
        store = CampaignStore(folder)
        try:
            store.acquire()
        except (CampaignError, KbMcpError):  # a run of it in progress, or a fault: the operator's to see
            continue
        try:
            if kept < keep:
                kept += 1
                continue
            # moved away whole under its lock: nobody sees, or resumes, a half-removed campaign
            gone = folder.with_name(f"{_REMOVING}{folder.name}-{secrets.token_hex(4)}")
            folder.rename(gone)
        finally:
            store.release()
        shutil.rmtree(gone, ignore_errors=True)
        removed.append(folder.name)
    if removed:
        log.info("removed %d finished campaign folder(s) of %s beyond its newest %d: %s", len(removed),
                 client or "a client", keep, ", ".join(removed))
    return removed


def _header(folder: Path) -> CampaignStatus | None:
    """The campaign header of `folder`, or None: not a campaign folder, or one that cannot be read."""
    if folder.name.startswith(".") or folder.is_symlink() or not folder.is_dir():
        return None
    try:
        return CampaignStore(folder).read_status()
    except (KbMcpError, OSError):
        return None


def _clear_removed(root: Path) -> None:
    """Finishes removals a killed process left (folders already moved away)."""
    for folder in root.glob(f"{_REMOVING}*") if root.is_dir() else []:
        shutil.rmtree(folder, ignore_errors=True)
