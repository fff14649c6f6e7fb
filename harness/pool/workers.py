"""The lifecycle of the worker pool's processes (server side): the active verify worker, its spare and
the census worker, started, found ready, retired after a fault and replaced, pinged for their health.

`WorkerPool` (`harness.pool.pool`) schedules requests on them; this class decides which process
serves and when one is replaced. A spare worker starts beside the active one, so that replacing a
worker after a fault costs no start-up (seconds of CUDA and profiler initialisation); the census
worker starts once the first worker says it has a GPU. Baselines are timed only in a worker no
candidate ran in (`_candidate_free`).
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from pathlib import Path

from pydantic import BaseModel

from kb_mcp.harness.pool.process import WorkerError, WorkerProcess, kill_all
from kb_mcp.harness.protocol import FROM_WORKER, PingReply, PingRequest, ResultFrame, WorkerInfo
from kb_mcp.harness.sandbox.channel import POOL_KEY, new_key, send
from kb_mcp.harness.sandbox.sandbox import Sandbox, detect
from kb_mcp.harness.sandbox.scratch import sweep_scratch
from kb_mcp.kb import paths

__all__ = ["Workers"]


class Workers:
    """The worker processes of a `WorkerPool`: the active verify worker, its spare and the census
    worker (see the module's docstring). Callers hold `_lock` around everything but `info`, `state`
    and `close`, which take it."""

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        *,
        start_timeout_s: float = 300.0,
        no_cuda: bool = False,
        sandbox: Sandbox | None = None,
        spare: bool = True,
    ) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir else paths.cache_dir()
        for sub in ("", "torch_extensions", "baselines"):
            (self.cache_dir / sub).mkdir(parents=True, exist_ok=True)
        self.sandbox = sandbox or detect()
        sweep_scratch()
        self.start_timeout_s = start_timeout_s
        self.no_cuda = no_cuda
        self.restarts = 0  # workers replaced after a timeout, crash, forged frame or retirement
        # A spare worker starts beside the active one, so that replacing a worker after a fault costs
        # no start-up (seconds of CUDA and profiler initialisation). It runs no candidate while it waits
        # (only baselines: `_candidate_free`).
        self.spare = spare
        self._lock = threading.Lock()
        self._worker: WorkerProcess | None = None
        self._spare: WorkerProcess | None = None
        self._census: WorkerProcess | None = None
        self.census_restarts = 0  # census workers replaced after a crash, timeout or finding
        self._all: list[WorkerProcess] = []
        self._finalizer = weakref.finalize(self, kill_all, self._all)

    # -- start, retirement, replacement -------------------------------------------------------

    def _new(self, role: str = "verify") -> WorkerProcess:
        w = WorkerProcess(self.sandbox, self.cache_dir, self.no_cuda, role)
        self._all.append(w)
        return w

    def _spawn(self) -> WorkerProcess:
        """Makes the spare (or a new worker) the active one, and starts a new spare."""
        spare, self._spare = self._spare, None
        self._worker = spare if spare is not None and spare.alive() else self._new()
        if spare is not None and spare is not self._worker:
            self._drop(spare)
        if self.spare:
            self._spare = self._new()
        return self._worker

    def _settle_starts(self) -> None:
        """Waits until no spare or census worker is still starting: their CUDA and profiler
        initialisation must not run beside a timed series."""
        for attr in ("_spare", "_census"):
            w: WorkerProcess | None = getattr(self, attr)
            if w is None or not w.starting():
                continue
            try:
                w.wait_ready(self.start_timeout_s)
            except WorkerError:
                self._drop(w)
                setattr(self, attr, None)

    def _drop(self, w: WorkerProcess) -> None:
        w.kill()
        if w in self._all:
            self._all.remove(w)

    def _replace(self, w: WorkerProcess) -> None:
        self._drop(w)
        self.restarts += 1
        self._spawn()

    def _retire(self, w: WorkerProcess) -> None:
        """Replaces `w`, the active worker or the spare."""
        if w is not self._spare:
            self._replace(w)
            return
        self._drop(w)
        self.restarts += 1
        self._spare = self._new() if self.spare else None

    def _send(self, w: WorkerProcess, request: BaseModel) -> None:
        """Sends a request to `w`. A worker gone since it was found ready (its end of the channel
        closed: a broken pipe, a reset) is replaced, and the request fails as a WorkerError (the
        harness's, asked again on the new worker), never as an OSError escaping to the caller."""
        try:
            send(w.sock, request, POOL_KEY)
        except (BrokenPipeError, ConnectionResetError) as exc:
            if w is self._worker:
                self._replace(w)
            else:  # the census worker: started again when next needed
                self._drop(w)
                self._census = None if w is self._census else self._census
            raise WorkerError(f"the {w.role} worker's channel closed before it took the request "
                              f"({exc.strerror or exc}); it was replaced: ask again") from exc

    def _ready(self) -> WorkerProcess:
        for attempt in range(2):
            w = self._worker
            if w is None:
                w = self._spawn()
            elif not w.alive():
                self._replace(w)
                w = self._worker
            assert w is not None
            try:
                w.wait_ready(self.start_timeout_s)
            except WorkerError:
                self._drop(w)
                self._worker = None
                if attempt:
                    raise
                continue
            if w.alive():
                if self._census is None and w.info is not None and w.info.cuda:
                    # Its profiler warm-up takes seconds: start it now, beside the first candidate's checks.
                    self._census = self._new("census")
                return w
        raise WorkerError("the harness worker exited right after starting")

    def _census_worker(self, untouched: bool = False) -> WorkerProcess:
        """The census worker, ready; with `untouched`, one no candidate has run in yet."""
        for attempt in range(2):
            w = self._census
            if w is None or not w.alive() or (untouched and w.served):
                if w is not None:
                    self._drop(w)
                w = self._census = self._new("census")
            try:
                w.wait_ready(self.start_timeout_s)
            except WorkerError:
                self._drop(w)
                self._census = None
                if attempt:
                    raise
                continue
            if w.reader.pending():  # bytes nobody asked for: start afresh
                self._replace_census(w)
                continue
            if w.alive():
                return w
        raise WorkerError("the census worker exited right after starting")

    def _replace_census(self, w: WorkerProcess) -> None:
        self._drop(w)
        self.census_restarts += 1
        self._census = self._new("census")

    def _candidate_free(self) -> WorkerProcess:
        """A ready verify worker that no candidate ran in: the active one while it has served none,
        else the spare (which runs no candidate while it waits), else a new active one. Baselines are
        timed only there: a candidate's changes to the process (dynamo's or inductor's settings and
        caches, patched functions) would otherwise be measured as the reference's figures and cached
        for every later candidate of the problem."""
        w = self._ready()
        if not w.served:
            return w
        spare = self._spare
        if spare is not None and spare.alive():
            try:
                spare.wait_ready(self.start_timeout_s)
                return spare
            except WorkerError:
                self._drop(spare)
                self._spare = None
        self._drop(w)
        self._worker = None
        return self._ready()

    # -- health ------------------------------------------------------------------------------

    def info(self) -> WorkerInfo:
        """What the active worker reported at start: pid (as seen here), cuda, device, arch, torch_version."""
        with self._lock:
            info = self._ready().info
            assert info is not None
            return info

    def state(self) -> dict[str, PingReply]:
        """What the running workers say of themselves now, by role (`verify`, `census` when one
        runs): their start-up info and how many profiler sessions the harness started in them."""
        with self._lock:
            out = {"verify": self._ping(self._ready())}
            if self._census is not None and self._census.alive():
                self._census.wait_ready(self.start_timeout_s)
                out["census"] = self._ping(self._census)
            return out

    def _ping(self, w: WorkerProcess) -> PingReply:
        rid = uuid.uuid4().hex
        key = new_key()
        self._send(w, PingRequest(rid=rid, key=key.hex()))
        frame = w.reader.read_message(FROM_WORKER, key, time.monotonic() + 60)
        if not isinstance(frame, ResultFrame) or frame.rid != rid or not isinstance(frame.body, PingReply):
            raise WorkerError(f"the {w.role} worker answered a ping with {frame.kind!r}")
        assert w.info is not None
        return frame.body.model_copy(update={"info": w.info})

    def close(self) -> None:
        """Stops the worker processes."""
        with self._lock:
            for w in list(self._all):
                w.stop()
            self._all.clear()
            self._worker = None
            self._spare = None
            self._census = None
