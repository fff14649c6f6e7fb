"""Stored profiles, one JSON file per `profile_id` in the KB's artifacts folder.

Profiles live beside the KB (`<kb stem>.artifacts/profiles/`), so every server sharing a KB
resolves every profile_id; the ncu report of a profile sits next to its JSON.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from pathlib import Path

from kb_mcp.harness.profile_model import Profile

_ID = re.compile(r"^p_[0-9a-f]{8,32}$")


class ProfileNotFound(KeyError):
    """No stored profile has this id (or the id is malformed)."""

    def __str__(self) -> str:  # KeyError quotes its argument; the message reads better plain
        return str(self.args[0]) if self.args else "profile not found"


def new_profile_id() -> str:
    """A fresh, unguessable profile id ('p_' + 12 hex digits)."""
    return "p_" + secrets.token_hex(6)


class ProfileStore:
    """Profiles by id under one folder; writes are atomic (temp file + os.replace)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _check(self, profile_id: str) -> str:
        if not _ID.match(profile_id or ""):
            raise ProfileNotFound(f"'{profile_id}' is not a profile id (they look like p_3f9a1c2b7d4e)")
        return profile_id

    def path(self, profile_id: str) -> Path:
        """Where the profile's JSON lives (whether or not it exists)."""
        return self.root / f"{self._check(profile_id)}.json"

    def report_base(self, profile_id: str) -> Path:
        """Base name for the profile's ncu report (ncu appends .ncu-rep)."""
        return self.root / self._check(profile_id)

    def save(self, profile: Profile) -> Path:
        """Writes the profile atomically and returns its path."""
        path = self.path(profile.profile_id)
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(profile.model_dump_json(indent=1))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def load(self, profile_id: str) -> Profile:
        """The stored profile; raises ProfileNotFound naming the id."""
        path = self.path(profile_id)
        if not path.is_file():
            raise ProfileNotFound(f"no profile '{profile_id}' in {self.root}; run profile_kernel first")
        return Profile.model_validate_json(path.read_text())

    def ids(self) -> list[str]:
        """Every stored profile id, oldest file first."""
        if not self.root.is_dir():
            return []
        files = sorted(self.root.glob("p_*.json"), key=lambda p: p.stat().st_mtime)
        return [p.stem for p in files if _ID.match(p.stem)]
