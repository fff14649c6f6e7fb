"""Each problem's best kernel of a campaign, saved as `best/<problem>.py` beside its records."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kb_mcp.campaign.models import problem_name
from kb_mcp.campaign.report import pick_best
from kb_mcp.campaign.store import CampaignStore

__all__ = ["write_best_kernels"]


def write_best_kernels(store: CampaignStore, problems: Sequence[str]) -> list[Path]:
    """Saves each problem's best kernel as `best/<problem>.py` (from the raw records); returns the files."""
    initials = store.initials()
    steps = store.steps()
    paths = []
    for path in problems:
        name = problem_name(path)
        best = pick_best(initials.get(name), [s for s in steps if s.problem == name])
        if best is None:
            continue
        source = store.kernel_source(name, best.candidate_id)
        timing = f"{best.time_ms:.4g} ms" if best.time_ms is not None else "not timed"
        header = (
            f"kb-mcp campaign best kernel for {name} ({path})\n"
            f"candidate {best.candidate_id}, from {best.origin}, {timing}"
            + ("" if best.verified else "\nUNVERIFIED: compile-only run; verify it on a GPU before use")
        )
        paths.append(store.write_best(name, source, header))
    return paths
