"""Job handles: start long work, get an id at once, poll its status, read its result later.

MCP clients give up on a tool call after their own timeout (often a minute), while a full
profile or a campaign takes longer. A job runs the same tool function in a background thread of
the server and keeps its record in `<artifacts>/jobs/<job_id>.json`, beside the KB, so:

* any server sharing the KB can report a job's status and result (the record is the truth);
* a status survives the server: a job whose server process died is reported `interrupted`;
* a cancel request written by any server reaches the running job at its next progress report.

Jobs run in this process's job slots (`server.job_slots`): campaigns in slots of their own, and
each HTTP session with a capped number of jobs, so no client can hold up every other's.

Every tool is a job kind. Work that only makes sense as a job (a campaign) is listed in
`kb_mcp.server.registry.JOB_ONLY_MODULES` (imported when first started), or registers itself with
`register_job_kind` (a module following the tool convention, or a `ToolSpec`).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from kb_mcp.kb.errors import ErrorInfo
from kb_mcp.kb.models import utcnow
from kb_mcp.server.execution import ToolFailure, ToolRunner, parse_request
from kb_mcp.server.job_slots import JobSlots
from kb_mcp.server.job_store import (
    JobProgress,
    JobRecord,
    JobStatus,
    JobStore,
    jobs_kept_per_client,
    new_job_id,
    owner_alive,
    this_owner,
)
from kb_mcp.server.registry import ToolSpec
from kb_mcp.tools.base import Progress
from kb_mcp.tools.disclosure import public_copy, redact, redact_data, redact_model

log = logging.getLogger(__name__)

_PROGRESS_WRITE_INTERVAL_S = 0.5  # progress hits the disk at most this often (cancel checks too)

_KINDS: dict[str, ToolSpec] = {}


def register_job_kind(kind: ToolSpec | ModuleType) -> ToolSpec:
    """Makes `kind` startable through `start_job` in every server built afterwards.

    `kind` is a module following the tool convention (NAME, DESCRIPTION, Request, Result, run) or
    a ToolSpec. Returns the spec; registering a name twice replaces the earlier kind.
    """
    spec = kind if isinstance(kind, ToolSpec) else ToolSpec.from_module(kind)
    _KINDS[spec.name] = spec
    return spec


def registered_job_kinds() -> list[ToolSpec]:
    """Job-only kinds registered by code with `register_job_kind`."""
    return list(_KINDS.values())


class JobCancelled(BaseException):
    """Raised inside a job's thread at its next progress report once a cancel was requested.

    A BaseException, so a tool's own `except Exception` cleanup cannot swallow it.
    """


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest() if key else ""


class JobManager:
    """Starts jobs in background threads of this process and answers for any job in the store."""

    def __init__(
        self,
        runner: ToolRunner,
        kinds: Iterable[ToolSpec],
        store: JobStore,
        lazy_kinds: Mapping[str, str] | None = None,
    ) -> None:
        self.runner = runner
        self.kinds: dict[str, ToolSpec] = {spec.name: spec for spec in kinds}
        self.lazy_kinds = {k: m for k, m in (lazy_kinds or {}).items() if k not in self.kinds}
        self.store = store
        self._owner = this_owner()
        self._cancel_events: dict[str, threading.Event] = {}
        self._slots = JobSlots()
        self.kept_per_client = jobs_kept_per_client()  # a bad setting stops the server here, by name
        self._finished: dict[str, list[str]] = {}  # client -> its finished jobs known here, oldest first
        self._finished_lock = threading.RLock()

    @property
    def kind_names(self) -> list[str]:
        """Every kind this manager can start (loaded or not yet imported)."""
        return sorted({*self.kinds, *self.lazy_kinds})

    def spec(self, kind: str) -> ToolSpec:
        """The kind's ToolSpec, importing a lazily declared kind's module on first use."""
        spec = self.kinds.get(kind)
        if spec is not None:
            return spec
        module = self.lazy_kinds.get(kind)
        if module is None:
            raise ToolFailure(f"unknown job kind {kind!r}; kinds: {', '.join(self.kind_names)}", expected=True)
        try:
            spec = ToolSpec.from_module(importlib.import_module(module))
        except Exception as exc:
            log.exception("job kind %s: cannot load %s", kind, module)
            raise ToolFailure(
                f"job kind {kind!r} is not available on this server ({module}: {type(exc).__name__}: {exc})",
                expected=False,
            ) from exc
        if spec.name != kind:
            raise ToolFailure(f"job kind {kind!r}: {module} defines {spec.name!r} instead", expected=False)
        self.kinds[kind] = spec
        return spec

    def start(self, kind: str, arguments: dict[str, Any], key: str = "") -> JobRecord:
        """Validates the arguments now (bad ones fail the call, not the job), then queues the job.
        `key` (shown once, to the submitter) reveals the job's private text to whoever holds it.
        MCP has no session that outlives a request to tell the submitter by, so the key is how."""
        spec = self.spec(kind)
        request = parse_request(spec, arguments)
        record = JobRecord(
            job_id=new_job_id(),
            kind=kind,
            arguments=request.model_dump(mode="json"),
            owner=self._owner,
            key_digest=_digest(key),
            client=self.runner.ctx.client_name,
        )
        # the submitter's caps (job_slots), before anything is stored
        self._slots.admit(record.job_id, spec.meta.long_running)
        try:
            self.store.write(record)
        except BaseException:
            self._slots.release(record.job_id)
            raise
        self._cancel_events[record.job_id] = threading.Event()
        work = functools.partial(self._work, record.job_id, record.client, spec, request)
        self._slots.submit(spec.meta.long_running, work)
        log.info("job %s (%s) queued", record.job_id, kind)
        return record

    @staticmethod
    def is_submitter(record: JobRecord, key: str | None) -> bool:
        """Whether `key` is the job's key (compared in constant time)."""
        return bool(key and record.key_digest) and hmac.compare_digest(_digest(key or ""), record.key_digest)

    def public(self, record: JobRecord) -> JobRecord:
        """`record` as anyone but its submitter may see it: the result's private fields blanked
        (`tools.disclosure.private`), the error text of a failed job withheld."""
        update: dict[str, Any] = {}
        if record.status == "failed" and record.error:
            update["error"] = "the job failed; its error is shown only with the job_key start_job returned"
            if record.error_info is not None:  # whose fault it was stays visible, not the text
                update["error_info"] = record.error_info.model_copy(
                    update={"message": update["error"], "where": None, "action": None})
        if record.result is not None:
            try:
                model = self.spec(record.kind).result.model_validate(record.result)
                update["result"] = public_copy(model).model_dump(mode="json")
            except Exception:  # noqa: BLE001 - a kind this server cannot load, or an old result: show nothing of it
                update["result"] = None
        return record.model_copy(update=update)

    def status(self, job_id: str) -> JobRecord:
        """The job's record; a job whose server died is marked `interrupted` on the way."""
        record = self.store.read(job_id)
        if record is None:
            raise ToolFailure(
                f"no job {job_id} in {self.store.root}: jobs live beside the KB (is this server on the same KB?), "
                f"and each client keeps its newest {self.kept_per_client} finished jobs, so the oldest one's record "
                "goes when another of its jobs finishes; start the job again if you still need its result",
                expected=True,
            )
        if not record.finished and not owner_alive(record.owner):
            record = self.store.update(job_id, _mark_interrupted)
        return record

    def cancel(self, job_id: str, key: str | None) -> JobRecord:
        """Asks the job to stop; it stops at its next progress report (or before it starts). Only the
        holder of the job's key may: another agent's work is not anyone else's to stop."""
        record = self.status(job_id)
        if not self.is_submitter(record, key):
            raise ToolFailure(
                f"job {job_id} was not cancelled: only whoever started it can cancel it, with the job_key "
                f"start_job returned{' (the key given is not that key)' if key else ''}",
                expected=True,
            )
        if record.finished:
            return record
        event = self._cancel_events.get(job_id)
        if event is not None:
            event.set()

        def request_cancel(rec: JobRecord) -> None:
            if rec.finished:
                return
            rec.cancel_requested = True
            if rec.status == "queued":  # never started: nothing will run, so it is cancelled now
                rec.status = "cancelled"
                rec.finished_at = utcnow()

        record = self.store.update(job_id, request_cancel)
        if record.status == "cancelled":  # cancelled while queued: it no longer counts towards the cap
            self._slots.release(job_id)
        return record

    def wait(self, job_id: str, timeout_s: float, on_change: Progress | None = None) -> JobRecord:
        """Polls the record until the job finishes or `timeout_s` passes, reporting progress changes."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        record = self.status(job_id)
        seen = record.progress.updated_at
        while not record.finished and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            record = self.status(job_id)
            if on_change is not None and record.progress.updated_at != seen:
                seen = record.progress.updated_at
                on_change(record.progress.done, record.progress.total, record.progress.message)
        return record

    def recover(self) -> list[str]:
        """Marks unfinished jobs of dead server processes `interrupted`, removes finished records past
        retention (`JobStore.prune`) and each client's beyond its newest `kept_per_client`; returns the
        ids marked."""
        marked, records = [], []
        for record in self.store.list(limit=1000):
            if not record.finished and not owner_alive(record.owner):
                record = self.store.update(record.job_id, _mark_interrupted)
                marked.append(record.job_id)
            records.append(record)
        finished = sorted((r for r in records if r.finished and r.client), key=lambda r: r.finished_at or r.created_at)
        for record in finished:  # oldest first
            self._remember_finished(record.client, record.job_id)
        try:
            pruned = self.store.prune()
        except OSError as exc:
            log.warning("could not remove old job records in %s: %s", self.store.root, exc)
        else:
            if pruned:
                log.info("removed %d finished job record(s) past retention", pruned)
        return marked

    def shutdown(self, wait: bool = True) -> None:
        """Stops accepting jobs; with `wait`, blocks until running jobs end."""
        self._slots.shutdown(wait)

    # -- inside the job's thread -------------------------------------------------------------

    def _work(self, job_id: str, client: str, spec: ToolSpec, request: BaseModel) -> None:
        cancel_event = self._cancel_events.setdefault(job_id, threading.Event())
        try:
            record = self.store.read(job_id)
            if record is None or record.finished or record.cancel_requested:
                if record is not None and not record.finished:
                    self._end(job_id, client, lambda r: _finish(r, "cancelled"))
                elif record is not None:  # cancelled while queued (`cancel`): it ended there
                    self._remember_finished(client, job_id)
                return
            self.store.update(job_id, _mark_running)
            try:
                result = self.runner.run(spec, request, self._progress_writer(job_id, cancel_event))
            except JobCancelled:
                self._end(job_id, client, lambda r: _finish(r, "cancelled", error="cancelled on request"))
                log.info("job %s cancelled", job_id)
            except ToolFailure as failure:
                message = redact(failure.message)
                info = redact_model(failure.info) if failure.info is not None else None
                self._end(job_id, client, lambda r: _finish(r, "failed", error=message, info=info))
                log.info("job %s failed: %s", job_id, message.splitlines()[0])
            else:
                payload = redact_data(result.model_dump(mode="json"))
                self._end(job_id, client, lambda r: _finish(r, "succeeded", result=payload))
                log.info("job %s succeeded", job_id)
        except Exception:  # the record must not stay "running" because bookkeeping failed
            log.exception("job %s: internal error", job_id)
            try:
                self._end(job_id, client, lambda r: _finish(r, "failed", error="internal error; see the server log"))
            except Exception:
                log.exception("job %s: could not record the failure", job_id)
        finally:
            self._cancel_events.pop(job_id, None)
            self._slots.release(job_id)

    def _end(self, job_id: str, client: str, change: Callable[[JobRecord], None]) -> None:
        """Writes how the job ended and counts it among its client's finished jobs in one step: a job
        anyone saw finished is counted before any job that ends after it, so the oldest go first. The
        client's oldest records go before this one is written finished, so that whoever sees it
        finished finds the client's records already within the bound."""
        with self._finished_lock:
            self._remember_finished(client, job_id)
            self.store.update(job_id, change)

    def _remember_finished(self, client: str, job_id: str) -> None:
        """`job_id` of `client` has finished: the client's oldest finished records beyond
        `kept_per_client` go (`JobStore.trim`), never another client's."""
        with self._finished_lock:
            finished = self._finished.setdefault(client, [])
            if job_id not in finished:
                finished.append(job_id)
            try:
                self._finished[client] = self.store.trim(finished, self.kept_per_client)
            except OSError as exc:  # a full or read-only disk: the next finished job tries again
                log.warning("could not remove old job records of %s in %s: %s", client or "a client",
                            self.store.root, exc)
            else:
                if len(self._finished[client]) < len(finished):
                    log.info("removed %d finished job record(s) of %s beyond its newest %d",
                             len(finished) - len(self._finished[client]), client or "a client", self.kept_per_client)

    def _progress_writer(self, job_id: str, cancel_event: threading.Event) -> Progress:
        last_write = 0.0

        def progress(done: float, total: float | None = None, message: str | None = None) -> None:
            nonlocal last_write
            if cancel_event.is_set():
                raise JobCancelled(job_id)
            now = time.monotonic()
            final = total is not None and done >= total
            if now - last_write < _PROGRESS_WRITE_INTERVAL_S and not final:
                return
            last_write = now

            def change(rec: JobRecord) -> None:
                rec.progress = JobProgress(done=done, total=total, message=message)

            record = self.store.update(job_id, change)
            if record.cancel_requested:  # asked through another server sharing the KB
                raise JobCancelled(job_id)

        return progress


def _mark_running(record: JobRecord) -> None:
    record.status = "running"
    record.started_at = utcnow()
    record.owner = this_owner()


def _mark_interrupted(record: JobRecord) -> None:
    if record.finished:
        return
    _finish(
        record,
        "interrupted",
        error=f"the server process that ran this job ({record.owner}) exited before it finished; start it again",
    )


def _finish(
    record: JobRecord,
    status: JobStatus,
    *,
    result: dict[str, Any] | None = None,
    error: str | None = None,
    info: ErrorInfo | None = None,
) -> None:
    record.status = status
    record.result = result
    record.error = error
    record.error_info = info
    record.finished_at = utcnow()
