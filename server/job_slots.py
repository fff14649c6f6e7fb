"""Job slots: the threads a server runs jobs in, shared by every client, so no client takes them all.

* A kind declaring itself long-running (`ToolMeta.long_running`: a campaign, hours against an LLM
  endpoint that may stall) runs in MAX_CONCURRENT_LONG_JOBS threads of its own, never in the
  MAX_CONCURRENT_JOBS threads of the other kinds: however many campaigns wait, a quick job still runs.
* One submitter (an agent of the agents file, else an HTTP client's MCP session, else every HTTP
  client with neither, named by `submitted_by`) has at most
  MAX_JOBS_PER_SUBMITTER jobs queued or running in this process, fewer than the other kinds' slots,
  and of them at most MAX_LONG_JOBS_PER_SUBMITTER long-running ones, fewer than their slots: one
  more is the caller's error, saying to wait for one or cancel one. Without the second bound one
  submitter's stalled campaigns would hold every campaign slot for hours, and another's campaign would
  wait queued all that time without a word.

Within a pool, jobs start first come, first served. An agent with a token of its own
(`server.agents`) is capped as itself, whatever session or protocol it uses. Clients of the shared
token have no identity here but their session (a job_key names a job, not who started it), so the
cap applies to their sessions; shared-token clients on the sessionless 2026-07-28 protocol cannot be
told apart, so they share one cap (SESSIONLESS). The one client of a stdio or in-process server
shares its slots with nobody. The campaigns' own slots protect the other kinds from every client alike.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from kb_mcp.server.execution import ToolFailure

MAX_CONCURRENT_JOBS = 4  # threads of the kinds that are not long-running
MAX_CONCURRENT_LONG_JOBS = 2  # threads of long-running kinds (campaigns), apart from the others
MAX_JOBS_PER_SUBMITTER = 3  # below MAX_CONCURRENT_JOBS: one submitter always leaves a slot to others
MAX_LONG_JOBS_PER_SUBMITTER = MAX_CONCURRENT_LONG_JOBS - 1  # and a campaign slot: campaigns last hours
SESSIONLESS = "sessionless"
"""The one submitter every HTTP client is that has neither a session nor a token of its own: clients
that cannot be told apart share one cap, so together they too leave a slot to others."""

_SUBMITTER: contextvars.ContextVar[str | None] = contextvars.ContextVar("kb_mcp_job_submitter", default=None)


@contextlib.contextmanager
def submitted_by(submitter: str | None) -> Iterator[None]:
    """Jobs started in the block (and in its threads that copy the context) count towards
    `submitter`'s cap; None (a stdio or in-process server's one client) has no cap."""
    token = _SUBMITTER.set(submitter)
    try:
        yield
    finally:
        _SUBMITTER.reset(token)


class JobSlots:
    """The two thread pools of one server, and the jobs each capped submitter has in them."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=MAX_CONCURRENT_JOBS, thread_name_prefix="kb-mcp-job")
        self._long_pool = ThreadPoolExecutor(max_workers=MAX_CONCURRENT_LONG_JOBS,
                                             thread_name_prefix="kb-mcp-long-job")
        # unfinished job -> its submitter and whether it is long-running (capped submitters only)
        self._submitters: dict[str, tuple[str, bool]] = {}
        self._lock = threading.Lock()

    def admit(self, job_id: str, long_running: bool = False) -> None:
        """Counts `job_id` (of a long-running kind or not) towards the current submitter's caps, or
        refuses it (the caller's error)."""
        submitter = _SUBMITTER.get()
        if submitter is None:
            return
        with self._lock:
            mine = [long for who, long in self._submitters.values() if who == submitter]
            if len(mine) >= MAX_JOBS_PER_SUBMITTER:
                raise _refusal(f"{len(mine)} jobs", f"MAX_JOBS_PER_SUBMITTER={MAX_JOBS_PER_SUBMITTER}",
                               "other clients' jobs still find a slot", submitter)
            if long_running and sum(mine) >= MAX_LONG_JOBS_PER_SUBMITTER:
                raise _refusal(f"{sum(mine)} long-running job(s) (a campaign)",
                               f"MAX_LONG_JOBS_PER_SUBMITTER={MAX_LONG_JOBS_PER_SUBMITTER}",
                               f"other clients' campaigns still find one of the {MAX_CONCURRENT_LONG_JOBS} slots "
                               "campaigns run in", submitter)
            self._submitters[job_id] = (submitter, long_running)

    def release(self, job_id: str) -> None:
        """`job_id` ended (or will never start): it no longer counts towards its submitter's cap."""
        with self._lock:
            self._submitters.pop(job_id, None)

    def submit(self, long_running: bool, work: Callable[[], None]) -> None:
        """Runs `work` in the long-running kinds' pool or the others', in the caller's context (what
        the job's sandboxed processes try is logged with its client's name)."""
        pool = self._long_pool if long_running else self._pool
        pool.submit(contextvars.copy_context().run, work)

    def shutdown(self, wait: bool = True) -> None:
        """Stops accepting jobs; with `wait`, blocks until running jobs end, else drops queued ones."""
        for pool in (self._pool, self._long_pool):
            pool.shutdown(wait=wait, cancel_futures=not wait)


def _refusal(held: str, cap: str, why: str, submitter: str) -> ToolFailure:
    """The caller's error for a job over one of its submitter's caps: what it holds, the cap, why the
    cap is there, and what to do."""
    return ToolFailure(
        f"not started: you already have {held} queued or running on this server, the most one client may "
        f"have at once ({cap}), so that {why}. Wait for one to finish (job_status(job_id, job_key, wait_s=30)) "
        "or cancel one you no longer need (cancel_job), then start this one again"
        + (". Clients without a session or a token of their own count as one here: ask the server's operator "
           "for your own token (kb-mcp serve --agents-file)" if submitter == SESSIONLESS else ""),
        expected=True,
    )
