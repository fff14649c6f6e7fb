"""Verified candidates: each candidate's source (`<artifacts>/candidates/<candidate_id>.py`), each
run's full report (`<candidate_id>.<options_digest>.json`) and its verdicts in the KB
(`CandidateRecord`), which of them the KB needs, and the bound on those it does not.

A candidate id is content-addressed, so several clients may verify, and share, one source. Each
client keeps the sources, reports and verdicts of at most its newest `candidates_kept_per_client()`
candidates that nothing needs (`Needs`) and that no other client verified; when one more of its
candidates is saved, the oldest beyond that go, files and verdicts in one locked transaction
(`trim`). Without the bound one client checking compile-only candidates in a loop wrote up to 1 MiB
(`tools.source.MAX_SOURCE_BYTES`) of source and some 600 B of KB (the file every server loads and
rewrites) every 0.2 s, for ever. What the KB needs stays: outcomes cite their candidate and parent,
lineages walk them, compositions take them. A candidate whose verdicts went is refused by name
(`unknown_candidate`: verify it again); one whose source alone went (`kb-mcp kb gc`, which asks
`Needs` too) shows why on its page (`removed_note`). Verdicts merged in from another KB file are
that file's clients', never counted against this KB's: the bound leaves them.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

from kb_mcp.kb import settings
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.errors import KBConflictError, KBLockTimeout
from kb_mcp.kb.models import CandidateRecord

if TYPE_CHECKING:
    from kb_mcp.harness.judgment.verdict import VerifyResult
    from kb_mcp.kb.store import KBStore
    from kb_mcp.kb.view import KBView

__all__ = [
    "CANDIDATES_KEPT_PER_CLIENT", "ENV_CANDIDATES_KEPT_PER_CLIENT", "Needs", "candidate_files",
    "candidates_kept_per_client", "pending_key", "removed_note", "save_candidate", "trim", "unknown_candidate",
    "waiting_candidate",
]

log = logging.getLogger(__name__)

CANDIDATES_KEPT_PER_CLIENT = 200
"""Candidates whose sources and verdicts one client keeps when nothing needs them and no other client
verified them: about 200 x 1 MiB of sources at the most (real sources are a few KB), and 200 x ~0.5 KB
of verdicts per options digest in the KB."""
ENV_CANDIDATES_KEPT_PER_CLIENT = "KB_MCP_CANDIDATES_KEPT_PER_CLIENT"
TRIM_LOCK_WAIT_S = 2.0  # then the next saved candidate trims instead: a busy KB never delays a verdict
_CANDIDATE_ID = re.compile(r"^c_[0-9A-Za-z_-]+$")


def candidates_kept_per_client() -> int:
    """How many unneeded candidates (sources and verdicts) each client keeps (``KB_MCP_CANDIDATES_KEPT_PER_CLIENT``,
    default CANDIDATES_KEPT_PER_CLIENT); SettingError for a value that is not a whole number of 1 or
    more (0 would remove a source before its client could record an outcome of it)."""
    return settings.count(ENV_CANDIDATES_KEPT_PER_CLIENT, CANDIDATES_KEPT_PER_CLIENT, positive=True)


# ---- verdicts waiting for the KB lock -----------------------------------------------------------

PENDING_PREFIX = "candidate-"


def pending_key(record: CandidateRecord) -> str:
    """The name a verdict waits under for the KB lock: one per verdict key and verifier, so two clients
    verifying the same source while the lock is busy both stay its verifiers (stored again under its
    key, a verdict keeps the earlier ones)."""
    who = hashlib.sha256("\0".join(record.verified_by).encode()).hexdigest()[:8]
    return f"{PENDING_PREFIX}{record.candidate_id}.{record.options_digest}.{who}"


def waiting_candidate(name: str) -> str | None:
    """The candidate id of a verdict waiting under the file or key `name` (`pending_key`), else None."""
    if not name.startswith(PENDING_PREFIX):
        return None
    return name.removeprefix(PENDING_PREFIX).split(".", 1)[0] or None


# ---- the files ----------------------------------------------------------------------------------


def save_candidate(folder: Path, result: VerifyResult, record: CandidateRecord, source: str) -> Path:
    """Keeps the candidate source (by candidate_id) and the full result of this run (by verdict key)
    in `folder`; returns the source's path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{result.candidate_id}.py"
    if not path.exists():
        write_atomic(path, source)  # a reader never sees half a source
    report = folder / f"{result.candidate_id}.{record.options_digest}.json"
    write_atomic(report, result.model_dump_json(indent=1))  # a reader (or kb gc) never sees half a verdict
    return path


def candidate_files(folder: Path, candidate_id: str) -> list[Path]:
    """The source and reports kept of one candidate (none for a name that is not a candidate id)."""
    if not _CANDIDATE_ID.match(candidate_id):
        return []
    return [p for p in folder.glob(f"{candidate_id}.*") if p.name.split(".", 1)[0] == candidate_id]


def removed_note(record: CandidateRecord) -> str:
    """Why a candidate whose verdict is in the KB (`record`, its strongest) has no source kept here."""
    if record.imported_from is not None:
        return (f"the verdict on {record.candidate_id} was merged in from {record.imported_from}, which keeps its "
                "source; it was never kept here")
    return (f"the source of {record.candidate_id} is no longer kept; its verdict stays. Sources that no outcome or "
            "lesson names, that no composition takes and that one client alone verified are kept for that client's "
            f"newest {candidates_kept_per_client()} candidates (${ENV_CANDIDATES_KEPT_PER_CLIENT}; older ones go with "
            "their verdicts), and removed by `kb-mcp kb gc` once older than its --candidate-days: verify the source "
            "again to keep it")


def unknown_candidate(view: KBView, candidate_id: str, client: str, what: str, fix: str) -> str:
    """The refusal of a `candidate_id` (the request's field `what`) the KB holds no verdict on: either
    never verified here, or one of `client`'s candidates whose verdicts left under its bound (`trim`),
    which the KB counts per client but does not name (a list of every removed id would grow for ever).
    `fix` says what else the caller can do."""
    removed = view.candidates_removed(client) if client else 0
    if not removed:
        return f"unknown {what} {candidate_id!r}: {fix}"
    return (
        f"unknown {what} {candidate_id!r}: the KB holds no verdict on it. Either compile_and_verify never checked it "
        f"here, or it is one of the {removed} candidate(s) of yours ({client!r}) whose verdicts were removed under "
        f"the bound: each client keeps its newest {candidates_kept_per_client()} candidates that no outcome or lesson "
        f"names, no composition takes and no other client verified (${ENV_CANDIDATES_KEPT_PER_CLIENT}); older ones "
        "lose their source and verdicts. Verify its source again with compile_and_verify (the same source gives the "
        f"same candidate_id), then call again. Otherwise: {fix}"
    )


# ---- what the KB needs --------------------------------------------------------------------------


class Needs:
    """Which kept sources the KB needs, read from one view: those an outcome (as its candidate or its
    parent) or a lesson names, those whose verdict waits in `pending_dir` to be committed, and those
    a composition takes for their problem (`KBView.composition_takes`, the rule of `kb.composition`).
    The view must stay open while this is asked."""

    def __init__(self, view: KBView, pending_dir: Path) -> None:
        self._view = view
        self._waiting = {waiting_candidate(p.name) for p in pending_dir.glob("*.json")}

    def why(self, candidate_id: str) -> str | None:
        """Why the KB needs the candidate's source, or None when nothing does."""
        if self._view.is_named(candidate_id):
            return "an outcome or a lesson names it"
        if candidate_id in self._waiting:
            return "its verdict waits to be committed"
        if self._view.composition_takes(candidate_id):  # each problem's pick kept by an index: no scan
            return "a composition takes it for its problem"
        return None


def trim(store: KBStore, folder: Path, client: str, keep: int) -> list[str]:
    """Removes the sources, reports and verdicts of `client`'s oldest candidates beyond its newest `keep`
    that nothing needs (`Needs`) and that it alone verified (`KBView.sole_candidates`); returns their ids.
    Decided and removed in one transaction under the KB lock, so no other client's verdict on one of
    them lands between; a lock busy past TRIM_LOCK_WAIT_S leaves them to the next candidate saved."""
    if not client:
        return []  # a verdict naming no client is nobody's alone: nothing to count it against
    try:
        with store.transaction(timeout=TRIM_LOCK_WAIT_S) as tx:
            needs = Needs(tx, store.pending_dir)
            unneeded = [c for c in tx.sole_candidates(client) if needs.why(c) is None]
            gone = unneeded[:max(0, len(unneeded) - keep)]  # oldest first
            tx.drop_verdicts(gone, client)
            for cid in gone:  # a source whose removal fails keeps its verdict: the transaction is not committed
                for path in candidate_files(folder, cid):
                    path.unlink(missing_ok=True)
    except KBLockTimeout:
        return []
    except (OSError, KBConflictError) as exc:  # a full disk, a lock file deleted: the next saved candidate tries again
        log.warning("could not remove old candidates of %s in %s: %s", client, folder, exc)
        return []
    if gone:
        log.info("removed the sources and verdicts of %d candidate(s) of %s beyond its newest %d",
                 len(gone), client, keep)
    return gone
