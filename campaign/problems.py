"""Which problem files a campaign runs: files and folders given on the command line or in a job."""

from __future__ import annotations

from pathlib import Path

from kb_mcp.campaign.models import problem_name
from kb_mcp.campaign.store import CampaignError

__all__ = ["resolve_problems"]


def resolve_problems(paths: list[str | Path]) -> list[str]:
    """Problem files from files and folders (a folder contributes its `*.py` files, sorted)."""
    files: list[Path] = []
    for entry in paths:
        p = Path(entry).expanduser()
        if p.is_dir():
            files += sorted(q for q in p.glob("*.py") if not q.name.startswith("_"))
        elif p.is_file():
            files.append(p)
        else:
            raise CampaignError(f"problem path not found: {p}")
    if not files:
        raise CampaignError("no problem files given (pass .py files in KernelBench format, or folders of them)")
    resolved = [str(f.resolve()) for f in files]
    names = [problem_name(f) for f in resolved]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise CampaignError(f"two problems share a file name ({', '.join(dupes)}); names must be unique in a campaign")
    return resolved
