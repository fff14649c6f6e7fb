"""Stored profiles, one JSON file per `profile_id` in the KB's artifacts folder.

Profiles live beside the KB (`<kb stem>.artifacts/profiles/`), so every server sharing a KB
resolves every profile_id; the ncu report of a profile sits next to its JSON.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from pydantic import ValidationError

from kb_mcp.harness.profile_model import Profile
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.errors import EnvironmentFault, storage_error

_ID = re.compile(r"^p_[0-9a-f]{8,32}$")


class ProfileNotFound(KeyError):
    """No stored profile has this id (or the id is malformed)."""

    def __str__(self) -> str:  # KeyError quotes its argument; the message reads better plain
        return str(self.args[0]) if self.args else "profile not found"


def new_profile_id() -> str:
    """A fresh, unguessable profile id ('p_' + 12 hex digits)."""
    return "p_" + secrets.token_hex(6)


class ProfileStore:
    """Profiles by id under one folder; writes are atomic and durable (fsynced temp file + rename).

    A stored file that cannot be read back as a profile is the environment's fault (a cut write, a
    hand edit, a full disk), never the caller's: `load` says which file and how to set it aside.
    """

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
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            # fsync: a profile outlives the process that took it (other servers share the KB)
            write_atomic(path, profile.model_dump_json(indent=1), fsync=True)
        except OSError as exc:
            raise storage_error(exc, "store the profile at", path) from exc
        return path

    def load(self, profile_id: str) -> Profile:
        """The stored profile. ProfileNotFound names an id with no profile; EnvironmentFault a stored
        file that cannot be read or is not a profile (naming the file and how to set it aside)."""
        path = self.path(profile_id)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise ProfileNotFound(f"no profile '{profile_id}' in {self.root}; run profile_kernel first") from None
        except OSError as exc:
            raise storage_error(exc, "read the stored profile", path) from exc
        try:
            return Profile.model_validate_json(data)
        except ValidationError as exc:  # cut, not JSON, or not a profile
            raise _damaged(path, exc) from exc

    def ids(self) -> list[str]:
        """Every stored profile id, oldest file first; a file removed while they are listed is left out."""
        if not self.root.is_dir():
            return []
        dated: list[tuple[float, str]] = []
        for path in self.root.glob("p_*.json"):
            if not _ID.match(path.stem):
                continue
            try:
                dated.append((path.stat().st_mtime, path.stem))
            except FileNotFoundError:  # deleted since the folder was listed
                continue
        return [stem for _, stem in sorted(dated)]


def _damaged(path: Path, exc: ValidationError) -> EnvironmentFault:
    """A stored profile that is no profile, in the words `JobStore.read` uses for a damaged job record."""
    first = exc.errors()[0]  # its words and place only: the file's text is not repeated
    reason = first["msg"] + (f" at {'.'.join(map(str, first['loc']))}" if first["loc"] else "")
    aside = path.with_name(path.name + ".damaged")
    return EnvironmentFault(
        f"the stored profile {path} is damaged and cannot be read ({reason})", where=path,
        action=f"move it aside (`mv {path} {aside}`) and run profile_kernel again for a new profile_id",
    )
