"""What every tool function gets: the KB, the artifact folders, and the (lazily started) harness.

The server builds one ToolContext per process; tests build their own. Heavy pieces (the KB
store, the GPU worker pool) are created on first use so that a KB-only call never imports
torch or starts a worker.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from kb_mcp.kb import paths
from kb_mcp.tools.lane import GpuLane

if TYPE_CHECKING:
    from kb_mcp.harness.pool.pool import WorkerPool
    from kb_mcp.harness.sandbox.sandbox import Sandbox
    from kb_mcp.kb.store import KBStore
    from kb_mcp.profiling.profile_standby import StandbyPool
    from kb_mcp.tools.source import FileAccess


_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("kb_mcp_caller", default=None)


@contextlib.contextmanager
def acting_for(client: str | None) -> Iterator[None]:
    """Tool calls made in the block (and in its threads and jobs, which copy the context) are
    `client`'s: an HTTP server's agent, told apart by its token. None leaves each context's own
    client name."""
    token = _CALLER.set(client)
    try:
        yield
    finally:
        _CALLER.reset(token)


class ToolContext:
    """Shared state of the tool functions of one server (or CLI) process."""

    def __init__(
        self,
        kb_path: str | Path | None = None,
        *,
        cache_dir: str | Path | None = None,
        client_name: str = "",
        standby_profiler: bool = True,
        files: FileAccess | None = None,
    ) -> None:
        self.kb_path = paths.resolve_kb_path(kb_path)
        self.artifacts_dir = paths.artifacts_dir(self.kb_path)
        self.cache_dir = Path(cache_dir) if cache_dir else paths.cache_dir()
        self._client_name = client_name
        # A one-shot process (kb-mcp call) exits after its call: a driver started for a next
        # profile would be wasted work.
        self.standby_profiler = standby_profiler
        self.files = files
        """Which files of this machine a tool reads where an argument names one (`tools.source.FileAccess`):
        None where the callers are this machine's user itself (stdio, the CLI), the operator's folders for
        an HTTP server's clients. Jobs run with this context, so they are held to it too."""
        # Made here, not on first use: two threads racing to create it would get two lanes.
        self.gpu_lane = GpuLane()
        """The one GPU lane of this context: every profile and timing holds it (tools.lane)."""
        self.closed = False
        """Set by `close`: a closed context starts no more profiling drivers."""

    @property
    def client_name(self) -> str:
        """Who the current call is to the KB (the verifier of what it verifies, the provenance of what
        it records): the agent a call is made for (`acting_for`), else this context's own client."""
        return _CALLER.get() or self._client_name

    @client_name.setter
    def client_name(self, name: str) -> None:
        self._client_name = name

    @cached_property
    def store(self) -> KBStore:
        """The KB store (created and seeded on first use when nothing of a KB is at its path; see
        `KBStore.open`)."""
        from kb_mcp.kb.store import KBStore

        store = KBStore.open(self.kb_path)
        # Artifacts, job records and worker scratch get no more access than the KB file grants
        # (private by default; group-writable for a KB shared with `kb init --group`).
        os.umask(paths.umask_for(os.stat(store.path).st_mode))
        return store

    @cached_property
    def sandbox(self) -> Sandbox:
        """How untrusted code is confined on this machine (raises SandboxUnavailable, with what to
        do, where it cannot be); this KB and its artifacts are among what it hides."""
        from kb_mcp.harness.sandbox.sandbox import detect

        return detect().with_private(self.private_places)

    @property
    def private_places(self) -> list[Path]:
        """What every sandbox verifying for this context hides from candidates, its own and those of the
        workers of a cluster on this machine: this KB's folder and its artifacts."""
        return [self.kb_path.parent, self.artifacts_dir]

    @cached_property
    def workers(self) -> WorkerPool:
        """The pool of sandboxed worker processes that compile, verify and time candidates."""
        from kb_mcp.harness.pool.pool import WorkerPool

        pool = WorkerPool(cache_dir=self.cache_dir, sandbox=self.sandbox)
        pool.settle = self.settle_profiler  # under the lane, before each GPU request (see settle_profiler)
        return pool

    @cached_property
    def profilers(self) -> StandbyPool | None:
        """Profiling drivers started ahead of the next profile_kernel call (see harness.profile_standby);
        None when this context was made without them, or is closed (a driver started in the
        background as its server stopped would have no one to stop it)."""
        if not self.standby_profiler or self.closed:
            return None
        from kb_mcp.profiling.profile_standby import StandbyPool

        return StandbyPool(self.cache_dir / "profile-standby")

    def settle_profiler(self, timeout_s: float = 20.0) -> None:
        """Waits while a profiling driver started by the last profile is still starting up: torch's
        import and a new CUDA context beside a timed run would disturb it (a waiting one does not,
        docs/benchmarks.md). Returns at once when none was started."""
        pool = self.__dict__.get("profilers")
        if pool is not None:
            pool.wait_ready(timeout_s)

    @property
    def profiles_dir(self) -> Path:
        """Stored profiles, one JSON file per profile_id (the KB is opened first: see `_kb_first`)."""
        return self._kb_first() / "profiles"

    @property
    def candidates_dir(self) -> Path:
        """Candidate sources by candidate_id, so a verdict can always be traced to its code."""
        return self._kb_first() / "candidates"

    def _kb_first(self) -> Path:
        """The artifacts folder, once the KB exists: artifacts written beside no KB would read as the
        remains of a deleted one, and the KB would then (rightly) not be created over them."""
        _ = self.store  # opening it creates the KB first
        return self.artifacts_dir

    def close(self) -> None:
        """Stops worker processes and a waiting profiling driver, if any were started."""
        self.closed = True
        pool = self.__dict__.pop("workers", None)
        if pool is not None:
            pool.close()
        standby = self.__dict__.pop("profilers", None)
        if standby is not None:
            standby.close()
