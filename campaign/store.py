"""A campaign's folder on disk: every file written atomically, so a kill leaves nothing half-written.

Layout::

    campaign.json                       CampaignStatus (config, state, runs)
    raw/initial/<problem>.json          InitialRecord
    raw/steps/<problem>/iNNN_sNNN.json  StepRecord
    raw/gradient/gNNNN.json             GradientRecord
    raw/kb_start.json                   KBSnapshot before the first step
    raw/retried/runNNN.json             the verifications a run re-ran on the cluster (list of Retry)
    kernels/<problem>/<candidate>.py    every candidate's source
    best/<problem>.py                   the best kernel per problem (recomputed from raw records)
    report/                             report.json, report.md, *.png

A record file appears complete or not at all (temp file, fsync, `os.replace`); a rerun finds the
finished units by listing these files and continues with the rest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from filelock import FileLock, Timeout
from pydantic import BaseModel, TypeAdapter, ValidationError

from kb_mcp.campaign.models import (
    CampaignStatus,
    GradientRecord,
    InitialRecord,
    KBSnapshot,
    Retry,
    StepRecord,
)
from kb_mcp.campaign.names import CampaignError
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.errors import EnvironmentFault, storage_error

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")
_RETRIES = TypeAdapter(list[Retry])


def atomic_write_text(path: Path, text: str) -> None:
    """Writes `text` to `path` so that readers (and a crash) see the old file or the new, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, fsync=True)


def _damaged(path: Path, what: str, exc: ValidationError) -> EnvironmentFault:
    """A record file that does not read back: this module writes each one whole (temp file, fsync,
    rename), so something else changed it (a hand edit, a damaged disk): the environment's fault."""
    first = exc.errors()[0]
    where = f" at {'.'.join(map(str, first['loc']))}" if first["loc"] else ""
    return EnvironmentFault(
        f"{path} is not {what} ({first['msg']}{where}): it was changed or damaged after it was written",
        where=path,
        action=f"restore it from a copy, or move it aside (`mv {path} {path}.damaged`): a resumed campaign "
        "redoes a step whose record is missing",
    )


def _unreadable(path: Path, exc: OSError) -> EnvironmentFault:
    """A record file listed in the folder that cannot be read (a folder or a dangling link in its
    place, permissions, a failing disk): the environment's; the run stops before anything is redone."""
    fault = storage_error(exc, "read the campaign record", path)
    fault.action = (f"{fault.action}; or move it aside (`mv {path} {path}.damaged`): a resumed campaign "
                    "redoes a unit whose record is missing")
    return fault


def _safe(name: str) -> str:
    if not _SAFE.match(name):
        raise CampaignError(f"{name!r} cannot name a file (letters, digits, '_', '.', '-' only)")
    return name


class CampaignStore:
    """Reads and writes the records of one campaign folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = FileLock(str(self.root / ".campaign.lock"))

    # -- exclusivity ---------------------------------------------------------------------------

    def acquire(self) -> None:
        """Claims the folder for this process; refuses if another run of it is in progress."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._lock.acquire(timeout=0)
        except Timeout as exc:
            raise CampaignError(
                f"another run of the campaign in {self.root} is in progress (lock {self._lock.lock_file}); "
                "wait for it to finish or stop it first", whose="environment"
            ) from exc
        except OSError as exc:  # a file where the folder should be, permissions, a full disk: the machine's
            raise storage_error(exc, "create the folder", self.root) from exc

    def release(self) -> None:
        """Gives the folder up."""
        if self._lock.is_locked:
            self._lock.release()

    # -- paths ---------------------------------------------------------------------------------

    @property
    def status_path(self) -> Path:
        return self.root / "campaign.json"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    def kernel_path(self, problem: str, candidate_id: str) -> Path:
        """Where a candidate's source is kept."""
        return self.root / "kernels" / _safe(problem) / f"{_safe(candidate_id)}.py"

    def best_path(self, problem: str) -> Path:
        """Where the best kernel of a problem is saved."""
        return self.root / "best" / f"{_safe(problem)}.py"

    def _step_path(self, problem: str, iteration: int, step: int) -> Path:
        return self.root / "raw" / "steps" / _safe(problem) / f"i{iteration:03d}_s{step:03d}.json"

    # -- records -------------------------------------------------------------------------------

    def _read(self, path: Path, model: type[M]) -> M:
        return self._validated(path, f"a {model.__name__} record", model.model_validate_json)

    @staticmethod
    def _validated(path: Path, what: str, validate: Callable[[bytes], T]) -> T:
        """A record file read and validated; a file that does not read back (damaged, a folder or a
        dangling link in its place, unreadable) is the environment's fault, said with what to do."""
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise _unreadable(path, exc) from exc
        try:
            return validate(data)
        except ValidationError as exc:
            raise _damaged(path, what, exc) from exc

    def read_status(self) -> CampaignStatus | None:
        """The campaign header, or None for a new folder."""
        return self._read(self.status_path, CampaignStatus) if self.status_path.exists() else None

    def write_status(self, status: CampaignStatus) -> None:
        atomic_write_text(self.status_path, status.model_dump_json(indent=1))

    def write_initial(self, record: InitialRecord) -> None:
        atomic_write_text(self.root / "raw" / "initial" / f"{_safe(record.problem)}.json",
                          record.model_dump_json(indent=1))

    def initials(self) -> dict[str, InitialRecord]:
        """Initial-generation records by problem."""
        folder = self.root / "raw" / "initial"
        records = [self._read(p, InitialRecord) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
        return {r.problem: r for r in records}

    def write_step(self, record: StepRecord) -> None:
        atomic_write_text(self._step_path(record.problem, record.iteration, record.step),
                          record.model_dump_json(indent=1))

    def steps(self) -> list[StepRecord]:
        """Every finished step, ordered by problem, iteration and step."""
        folder = self.root / "raw" / "steps"
        if not folder.is_dir():
            return []
        records = [self._read(p, StepRecord) for p in sorted(folder.glob("*/i*_s*.json"))]
        return sorted(records, key=lambda r: (r.problem, r.iteration, r.step))

    def write_gradient(self, record: GradientRecord) -> None:
        atomic_write_text(self.root / "raw" / "gradient" / f"g{record.index:04d}.json",
                          record.model_dump_json(indent=1))

    def gradients(self) -> list[GradientRecord]:
        """Every finished textual-gradient batch, in order."""
        folder = self.root / "raw" / "gradient"
        records = [self._read(p, GradientRecord) for p in sorted(folder.glob("g*.json"))] if folder.is_dir() else []
        return sorted(records, key=lambda r: r.index)

    def write_kb_start(self, snapshot: KBSnapshot) -> None:
        """Keeps the KB's size before the campaign's first step (a resume does not overwrite it)."""
        path = self.root / "raw" / "kb_start.json"
        if not path.exists():
            atomic_write_text(path, snapshot.model_dump_json(indent=1))

    def kb_start(self) -> KBSnapshot | None:
        path = self.root / "raw" / "kb_start.json"
        return self._read(path, KBSnapshot) if path.exists() else None

    def write_retried(self, retried: Sequence[Retry]) -> None:
        """Keeps what the run in progress (its number from the header) re-ran on the cluster; written
        when the run ends or stops: a coordinator killed outright takes its own run's list with it.
        Nothing is written for none."""
        if retried:
            status = self.read_status()
            run = status.runs if status is not None else 1
            atomic_write_text(self.root / "raw" / "retried" / f"run{run:03d}.json",
                              _RETRIES.dump_json(list(retried), indent=1).decode())

    def retried(self) -> list[Retry]:
        """What every run of the folder re-ran on the cluster, run by run."""
        folder = self.root / "raw" / "retried"
        found: list[Retry] = []
        for path in sorted(folder.glob("run*.json")) if folder.is_dir() else []:
            found += self._validated(path, "a list of Retry records", _RETRIES.validate_json)
        return found

    # -- kernels -------------------------------------------------------------------------------

    def save_kernel(self, problem: str, candidate_id: str, source: str) -> Path:
        """Keeps a candidate's source (content-addressed: written once)."""
        path = self.kernel_path(problem, candidate_id)
        if not path.exists():
            atomic_write_text(path, source)
        return path

    def kernel_source(self, problem: str, candidate_id: str) -> str:
        """The source of a candidate kept by `save_kernel`."""
        path = self.kernel_path(problem, candidate_id)
        try:
            return path.read_text()
        except FileNotFoundError as exc:
            raise CampaignError(f"kernel source {path} is missing; the campaign folder is incomplete: restore its "
                                f"kernels/ folder ({self.root / 'kernels'}) from a copy, or run the campaign again "
                                "in a new folder (another --name or --out)", whose="environment") from exc

    def write_best(self, problem: str, source: str, header: str) -> Path:
        """Saves the best kernel of `problem`, with a comment header saying what it is."""
        path = self.best_path(problem)
        comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
        atomic_write_text(path, comment + source)
        return path
