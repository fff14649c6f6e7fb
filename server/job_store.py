"""Job records on disk: one JSON file per job in `<artifacts>/jobs/`, written atomically and changed
under a per-file lock, so any server sharing the KB reads the same truth (`server.jobs` runs the jobs).
A record that is damaged on disk is the environment's fault, named with its path."""

from __future__ import annotations

import builtins
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kb_mcp.kb import settings
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.errors import EnvironmentFault, ErrorInfo
from kb_mcp.kb.models import utcnow
from kb_mcp.kb.owners import process_alive
from kb_mcp.server.execution import ToolFailure

__all__ = [
    "ENV_JOBS_KEPT_PER_CLIENT", "FINISHED", "JOBS_KEPT", "JOBS_KEPT_PER_CLIENT", "JOB_RETENTION_DAYS", "JobProgress",
    "JobRecord", "JobStatus", "JobStore", "jobs_kept_per_client", "new_job_id", "owner_alive", "this_owner",
]

log = logging.getLogger(__name__)

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "interrupted"]
FINISHED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "interrupted"})


_JOB_ID = re.compile(r"^j_\d{14}_[0-9a-f]{6}$")
JOB_RETENTION_DAYS = 14.0  # finished job records older than this go at server start and in `kb-mcp kb gc`
JOBS_KEPT = 500  # and the oldest finished ones beyond this many
JOBS_KEPT_PER_CLIENT = 50
"""Finished job records one client keeps on a server while it runs: when another of its jobs finishes,
its oldest finished record beyond this many goes. A record holds the job's arguments (a problem and a
candidate of up to 1 MiB each) and its result, so without it one client starting quick jobs in a loop
fills the disk before the next server start prunes anything."""
ENV_JOBS_KEPT_PER_CLIENT = "KB_MCP_JOBS_KEPT_PER_CLIENT"


def jobs_kept_per_client() -> int:
    """How many finished job records each client keeps (``KB_MCP_JOBS_KEPT_PER_CLIENT``, default
    JOBS_KEPT_PER_CLIENT); SettingError for a value that is not a whole number of 1 or more (0 would
    remove a job's result before its client could read it)."""
    return settings.count(ENV_JOBS_KEPT_PER_CLIENT, JOBS_KEPT_PER_CLIENT, positive=True)


class JobProgress(BaseModel):
    """The last progress a job reported."""

    model_config = ConfigDict(extra="forbid")

    done: float = 0.0
    total: float | None = None
    message: str | None = None
    updated_at: datetime = Field(default_factory=utcnow)


class JobRecord(BaseModel):
    """A job as stored on disk: what was asked, where it stands, and how it ended."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    kind: str
    status: JobStatus = "queued"
    # who started it, as the KB names its clients (`agent:NAME`, every client of the shared token as
    # one, a stdio client's own name): finished records are kept per client (JOBS_KEPT_PER_CLIENT)
    client: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)
    progress: JobProgress = Field(default_factory=JobProgress)
    result: dict[str, Any] | None = None
    error: str | None = None
    error_info: ErrorInfo | None = None  # whose the failure is (see kb_mcp.kb.errors)
    owner: str = ""  # host:pid of the server process running it
    # sha256 of the job's key (start_job returns the key once): its holder is the job's submitter
    # and sees its private text (candidate output, exception text, errors); nobody else does.
    key_digest: str = ""
    cancel_requested: bool = False
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        """True once the job can change no more."""
        return self.status in FINISHED


def this_owner() -> str:
    """This server process, as a job record names its owner (host:pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str) -> bool:
    """False only when the owner is a process on this host that no longer exists."""
    host, _, pid_text = owner.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return True  # another machine's process: we cannot tell, so we do not guess
    return process_alive(int(pid_text))


def new_job_id() -> str:
    """A sortable, unguessable-enough id: creation time (UTC) plus random hex."""
    return f"j_{utcnow():%Y%m%d%H%M%S}_{secrets.token_hex(3)}"


class JobStore:
    """Job records as one JSON file each, written atomically, changed under a per-file lock."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, job_id: str) -> Path:
        """The record file of `job_id`; refuses ids that are not job ids (no path tricks)."""
        if not _JOB_ID.match(job_id):
            raise ToolFailure(
                f"{job_id!r} is not a job id (job ids look like j_20261122120000_a1b2c3); "
                "use the id start_job returned, or read kb://jobs for recent jobs",
                expected=True,
            )
        return self.root / f"{job_id}.json"

    def _lock(self, job_id: str) -> FileLock:
        return FileLock(str(self.path(job_id)) + ".lock", timeout=30)

    def read(self, job_id: str) -> JobRecord | None:
        """The record, or None if there is no such job."""
        path = self.path(job_id)
        try:
            return JobRecord.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValidationError as exc:  # cut, not JSON, or not a job record
            first = exc.errors()[0]  # its words and place only: the record's text may be the submitter's alone
            reason = first["msg"] + (f" at {'.'.join(map(str, first['loc']))}" if first["loc"] else "")
            raise EnvironmentFault(
                f"the job record {path} is damaged and cannot be read ({reason})", where=path,
                action=f"nothing else beside the KB is affected: remove the record (`rm {path}`) and start the job "
                "again if its result is needed",
            ) from exc

    def write(self, record: JobRecord) -> None:
        """Writes `record` atomically (readers never see a torn file)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(record.job_id)
        write_atomic(path, record.model_dump_json(indent=1))

    def update(self, job_id: str, change: Callable[[JobRecord], None]) -> JobRecord:
        """Re-reads the record under its lock, applies `change`, writes it back, returns it."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock(job_id):
            record = self.read(job_id)
            if record is None:
                raise ToolFailure(f"no job {job_id} in {self.root}", expected=True)
            change(record)
            self.write(record)
            return record

    def list(self, limit: int = 50) -> list[JobRecord]:
        """The most recent records, newest first."""
        if not self.root.is_dir():
            return []
        records: list[JobRecord] = []
        for path in sorted(self.root.glob("j_*.json"), reverse=True)[:limit]:
            try:
                records.append(JobRecord.model_validate_json(path.read_text()))
            except (OSError, ValueError) as exc:  # one bad file must not hide the others
                log.warning("skipping unreadable job record %s: %s", path, exc)
        return records


    def expired(self, max_age_s: float, keep: int, now: float | None = None) -> builtins.list[tuple[str, str]]:
        """Finished jobs past retention, with why: older than `max_age_s`, or beyond the newest
        `keep` finished ones. A job still queued or running (its server alive) never expires."""
        now = time.time() if now is None else now
        finished: list[tuple[str, float]] = []
        for path in sorted(self.root.glob("j_*.json"), reverse=True) if self.root.is_dir() else []:
            try:
                record = JobRecord.model_validate_json(path.read_text())
            except (OSError, ValueError):
                continue  # unreadable: list() warns about it; an operator should look at it
            if not record.finished and owner_alive(record.owner):
                continue
            ended = (record.finished_at or record.created_at).timestamp()
            finished.append((record.job_id, ended))
        out = []
        for rank, (job_id, ended) in enumerate(finished):
            if now - ended > max_age_s:
                out.append((job_id, f"finished {(now - ended) / 86400:.0f} days ago"))
            elif rank >= keep:
                out.append((job_id, f"beyond the newest {keep} finished jobs"))
        return out

    def files_of(self, job_id: str) -> builtins.list[Path]:
        """The record of a job and its lock file (those that exist)."""
        path = self.path(job_id)
        return [p for p in (path, path.with_name(path.name + ".lock")) if p.exists()]

    def trim(self, finished: builtins.list[str], keep: int) -> builtins.list[str]:
        """Keeps one client's newest `keep` finished jobs (`finished`: their ids, oldest first) and
        removes the records of the others, oldest first. A record found unfinished is kept whatever
        (never a job that may still run). Returns the ids still kept, oldest first."""
        kept = list(finished)
        for job_id in finished[:max(0, len(finished) - keep)]:
            with self._lock(job_id):
                try:
                    record = self.read(job_id)
                except EnvironmentFault:  # damaged since it finished: it goes like any other
                    record = None
                if record is not None and not record.finished:
                    continue
                self.path(job_id).unlink(missing_ok=True)
            Path(self._lock(job_id).lock_file).unlink(missing_ok=True)
            kept.remove(job_id)
        return kept

    def prune(self, max_age_s: float = JOB_RETENTION_DAYS * 86400, keep: int = JOBS_KEPT) -> int:
        """Removes expired job records (see `expired`); returns how many went."""
        gone = 0
        for job_id, _ in self.expired(max_age_s, keep):
            for path in self.files_of(job_id):
                path.unlink(missing_ok=True)
            gone += 1
        for tmp in self.root.glob(".j_*.tmp*") if self.root.is_dir() else []:  # writers killed mid-write
            if time.time() - tmp.stat().st_mtime > 3600:
                tmp.unlink(missing_ok=True)
        return gone
