"""The worker pool: candidates run in a warm worker process, never in the caller's.

`WorkerPool.verify(problem, source, options, progress) -> VerifyResult` sends one candidate to the
worker (torch and CUDA initialised once, started with `python -m kb_mcp.harness.worker_main`, a
fresh interpreter) over a private socket pair, and waits for the answer with a limit per phase
(build, checks, timing, baselines). A worker that hangs is killed at the limit (verdict `timeout`);
one that dies (segfault, abort, `os._exit`, out-of-memory kill) yields `crashed` with how it ended;
one that says it is unfit after a candidate (CUDA error, tampering, leftover thread) exits. In
every case a replacement is started at once, so the next candidate finds a warm worker.

The worker's stdout and stderr are a pipe this process drains continuously, keeping the head and
tail of each request's output (a candidate that floods its output costs nothing but CPU). Frames on
the channel are authenticated per request (see `harness.channel`); a frame that fails, arrives out
of order or disagrees with the request ends the request as `invalid` with `forged_result`.

Timing happens in a process that has never started a profiler session: the kernel census, which
needs one, runs in a census worker of its own (`harness.census`). A verify worker that reaches the
census (the candidate passed every check) tells the pool and waits; the pool asks the census
worker, waits until no worker of the pool is still starting up, and only then answers, so that
nothing else of the harness runs while the verify worker times.

Without a GPU the worker still starts (torch CPU build) and serves the compile-only path.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import weakref
from pathlib import Path
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from kb_mcp.harness.candidate import CandidateError, parse_candidate, static_units, style_of
from kb_mcp.harness.census import CENSUS_WORDS, CensusReply
from kb_mcp.harness.channel import POOL_KEY, ChannelClosed, ChannelError, ForgedFrame, FrameReader, new_key, send
from kb_mcp.harness.problem import Problem, candidate_id
from kb_mcp.harness.verdict import CompileResult, Finding, FindingCode, VerifyOptions, VerifyResult
from kb_mcp.kb import paths
from kb_mcp.kb.models import Verdict
from kb_mcp.kb.progress import Progress, no_progress


HEAD_BYTES = 64 << 10  # output kept from the start of a request...
TAIL_BYTES = 64 << 10  # ...and from its end
PHASES = ("static", "import", "construct", "check", "census", "timing", "baselines", "compile")
_PHASE_WORDS = {
    "queued": "waiting for the worker to start on it",
    "static": "running static checks",
    "import": "importing and building the candidate",
    "construct": "constructing ModelNew",
    "check": "running ModelNew.forward on the input sets",
    "census": "listing the kernels one forward launches (in the census worker)",
    "timing": "timing ModelNew.forward (interleaved with the reference where eager is timed anew)",
    "baselines": "timing the torch.compile baseline (first verdict of a problem) and comparing",
    "compile": "compiling the candidate's CUDA sources",
}


class WorkerError(RuntimeError):
    """The worker process could not be started or answered nonsense to a harmless request."""


class _Output:
    """Drains a worker's stdout/stderr pipe on a thread, keeping head and tail since the last reset."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.last = time.monotonic()
        self.thread = threading.Thread(target=self._drain, name="kb-mcp-worker-output", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            with self.lock:
                self.total += len(chunk)
                self.last = time.monotonic()
                room = HEAD_BYTES - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
                    chunk = chunk[room:]
                if chunk:
                    self.tail += chunk
                    if len(self.tail) > TAIL_BYTES:
                        del self.tail[: len(self.tail) - TAIL_BYTES]
        os.close(self.fd)

    def reset(self) -> None:
        """Starts a new request's capture."""
        with self.lock:
            self.head.clear()
            self.tail.clear()
            self.total = 0

    def settle(self, quiet_s: float = 0.05, max_s: float = 0.5) -> None:
        """Waits until the pipe has been quiet for `quiet_s` (bounded by `max_s`)."""
        end = time.monotonic() + max_s
        while time.monotonic() < end:
            with self.lock:
                idle = time.monotonic() - self.last
            if idle >= quiet_s:
                return
            time.sleep(quiet_s / 2)

    def take(self, limit: int) -> str:
        """The captured text, at most `limit` characters (head and tail, with the gap marked)."""
        with self.lock:
            head, tail, total = bytes(self.head), bytes(self.tail), self.total
        if limit <= 0 or total == 0:
            return ""
        kept = len(head) + len(tail)
        text_h = head.decode("utf-8", "replace")
        text_t = tail.decode("utf-8", "replace")
        if kept == total and len(text_h) + len(text_t) <= limit:
            return text_h + text_t
        half = max(1, limit // 2)
        return f"{text_h[:half]}\n[... {total - min(total, 2 * half)} bytes of output omitted ...]\n{text_t[-half:]}"


class _Worker:
    """One worker process and its channel."""

    def __init__(self, cache_dir: Path, no_cuda: bool, env: dict[str, str], role: str = "verify") -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [sys.executable, "-m", "kb_mcp.harness.worker_main", "--channel-fd", str(child.fileno()),
                "--cache-dir", str(cache_dir), "--role", role]
        if no_cuda:
            argv.append("--no-cuda")
        self.role = role
        out_r, out_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                argv, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w,
                env=env, start_new_session=True, close_fds=True,
            )
        finally:
            child.close()
            os.close(out_w)
        self.sock = parent
        self.reader = FrameReader(parent)
        self.output = _Output(out_r)
        self.session = new_key()
        self.info: dict[str, Any] | None = None
        self.started = time.monotonic()
        send(parent, {"op": "init", "key": self.session.hex()}, POOL_KEY)

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """The worker's hello (device, torch version), waiting for its start-up."""
        if self.info is None:
            try:
                hello = self.reader.read(self.session, time.monotonic() + timeout_s)
            except TimeoutError as exc:
                self.kill()
                raise WorkerError(f"the harness worker did not start within {timeout_s:.0f} s") from exc
            except ChannelError as exc:
                code = self.proc.wait(timeout=10)
                self.output.settle()
                raise WorkerError(
                    f"the harness worker failed to start ({describe_exit(code)}): {self.output.take(2000)}"
                ) from exc
            if hello.get("type") != "hello":
                self.kill()
                raise WorkerError(f"the harness worker answered {hello.get('type')!r} instead of hello")
            self.info = dict(hello.get("info") or {})
        return self.info

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def starting(self) -> bool:
        """True while the process runs but has not said hello yet (it is initialising CUDA)."""
        return self.info is None and self.alive()

    def kill(self) -> None:
        """Kills the worker and everything it started (compilers included)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process stuck in the driver
            pass
        self.sock.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Asks the worker to exit, then kills it if it does not."""
        if self.proc.poll() is None:
            try:
                send(self.sock, {"op": "exit"}, POOL_KEY)
                self.proc.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


class _Reply:
    """Reading one request's answer from a worker: phase frames, then the result frame.

    Every frame must carry the request id and the next sequence number (else `ForgedFrame`); each
    phase frame is passed to `on_phase` and restarts the deadline with that phase's limit. `phase`
    says where the worker was when reading ended (for a timeout or crash message). Raises what
    `FrameReader.read` raises: TimeoutError, ChannelClosed, ForgedFrame.
    """

    def __init__(self, w: _Worker, rid: str, key: bytes, limit: Callable[[str], float], what: str,
                 channel: str) -> None:
        self.w = w
        self.rid = rid
        self.key = key
        self.limit = limit
        self.what = what  # "request" / "census": how an out-of-sequence frame is named
        self.channel = channel  # where an unexpected frame type arrived
        self.phase = "queued"

    def read(self, on_phase: Callable[[str], None]) -> tuple[Any, bool]:
        """(the result frame's payload, whether the worker retires) once the result arrives."""
        deadline = time.monotonic() + self.limit(self.phase)
        seq = 0
        while True:
            frame = self.w.reader.read(self.key, deadline)
            if frame.get("rid") != self.rid or frame.get("seq") != seq:
                raise ForgedFrame(
                    f"a frame for request {str(frame.get('rid'))[:12]}, number {frame.get('seq')} arrived where "
                    f"number {seq} of this {self.what} was due"
                )
            seq += 1
            kind = frame.get("type")
            if kind == "phase":
                self.phase = str(frame.get("phase"))
                on_phase(self.phase)
                deadline = time.monotonic() + self.limit(self.phase)
                continue
            if kind != "result":
                raise ForgedFrame(f"unexpected frame type {kind!r} on {self.channel}")
            return frame.get("result"), bool(frame.get("retire"))


def describe_exit(code: int | None) -> str:
    """'killed by SIGSEGV' / 'exit status 3' for a process return code."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        try:
            w.kill()
        except Exception:  # pragma: no cover - best effort at interpreter exit
            pass


class WorkerPool:
    """A warm harness worker (one: candidates share one GPU) and the requests sent to it.

    Besides the active worker the pool keeps a spare (same role, idle until a fault makes it the
    active one) and a census worker (`harness.census`), started once the first worker says it has
    a GPU (elsewhere on first use). Thread-safe: concurrent `verify` calls are served one
    after another.
    """

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        *,
        start_timeout_s: float = 300.0,
        no_cuda: bool = False,
        env: dict[str, str] | None = None,
        prestart: bool = False,
        spare: bool = True,
    ) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir else paths.cache_dir()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.start_timeout_s = start_timeout_s
        self.no_cuda = no_cuda
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", paths.ENV_CACHE: str(self.cache_dir)}
        self.restarts = 0  # workers replaced after a timeout, crash, forged frame or retirement
        # A spare worker starts beside the active one, so that replacing a worker after a fault costs
        # no start-up (seconds of CUDA and profiler initialisation). It runs no candidate while it waits.
        self.spare = spare
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        self._spare: _Worker | None = None
        self._census: _Worker | None = None
        self.census_restarts = 0  # census workers replaced after a crash, timeout or finding
        self._all: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _kill_all, self._all)
        if prestart:
            self._spawn()

    # -- lifecycle ---------------------------------------------------------------------------

    def _new(self, role: str = "verify") -> _Worker:
        w = _Worker(self.cache_dir, self.no_cuda, self.env, role)
        self._all.append(w)
        return w

    def _spawn(self) -> _Worker:
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
            w: _Worker | None = getattr(self, attr)
            if w is None or not w.starting():
                continue
            try:
                w.wait_ready(self.start_timeout_s)
            except WorkerError:
                self._drop(w)
                setattr(self, attr, None)

    def _drop(self, w: _Worker) -> None:
        w.kill()
        if w in self._all:
            self._all.remove(w)

    def _replace(self, w: _Worker) -> None:
        self._drop(w)
        self.restarts += 1
        self._spawn()

    def _ready(self) -> _Worker:
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
                if self._census is None and (w.info or {}).get("cuda"):
                    # Its profiler warm-up takes seconds: start it now, beside the first candidate's checks.
                    self._census = self._new("census")
                return w
        raise WorkerError("the harness worker exited right after starting")

    def info(self) -> dict[str, Any]:
        """What the worker reported at start: pid, cuda, device, arch, torch_version."""
        with self._lock:
            return dict(self._ready().info or {})

    def state(self) -> dict[str, dict[str, Any]]:
        """What the running workers say of themselves now, by role (`verify`, `census` when one
        runs): their start-up info and how many profiler sessions the harness started in them."""
        with self._lock:
            out = {"verify": self._ping(self._ready())}
            if self._census is not None and self._census.alive():
                self._census.wait_ready(self.start_timeout_s)
                out["census"] = self._ping(self._census)
            return out

    def _ping(self, w: _Worker) -> dict[str, Any]:
        rid = uuid.uuid4().hex
        key = new_key()
        send(w.sock, {"op": "ping", "rid": rid, "key": key.hex()}, POOL_KEY)
        frame = w.reader.read(key, time.monotonic() + 60)
        if frame.get("rid") != rid or frame.get("type") != "result":
            raise WorkerError(f"the {w.role} worker answered a ping with {frame.get('type')!r}")
        return dict(frame.get("result") or {})

    def close(self) -> None:
        """Stops the worker processes."""
        with self._lock:
            for w in list(self._all):
                w.stop()
            self._all.clear()
            self._worker = None
            self._spare = None
            self._census = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ----------------------------------------------------------------------------

    def verify(
        self,
        problem: Problem,
        source: str,
        options: VerifyOptions | None = None,
        progress: Progress = no_progress,
    ) -> VerifyResult:
        """Compiles, checks and times `source` against `problem` in the worker; never raises for a
        misbehaving candidate (its verdict says what happened). Raises WorkerError only when no
        worker can be started at all."""
        opts = options or VerifyOptions()
        cid = candidate_id(problem, source)
        t0 = time.monotonic()
        try:
            parse_candidate(source)
        except CandidateError as exc:
            return VerifyResult(
                candidate_id=cid, problem=problem.name, problem_hash=problem.hash, verdict=Verdict.compile_error,
                summary=f"compile error: {exc}", compile=CompileResult(ok=False, messages=[str(exc)]), phase="static",
            )
        with self._lock:
            w = self._ready()
            if w.reader.pending():
                # Bytes nobody asked for: a previous candidate left something writing to the channel.
                self._replace(w)
                w = self._ready()
            return self._request(w, problem, source, opts, cid, progress, t0)

    def _limit(self, phase: str, opts: VerifyOptions) -> float:
        if phase in ("queued", "static", "import", "construct", "compile"):
            return opts.compile_timeout_s
        if phase == "baselines":
            return max(600.0, opts.timeout_s)
        return opts.timeout_s

    def _request(self, w: _Worker, problem: Problem, source: str, opts: VerifyOptions, cid: str,
                 progress: Progress, t0: float) -> VerifyResult:
        rid = uuid.uuid4().hex
        key = new_key()
        w.output.reset()
        send(w.sock, {
            "op": "verify", "rid": rid, "key": key.hex(), "problem": problem.model_dump(mode="json"),
            "source": source, "options": opts.model_dump(mode="json"), "candidate_id": cid,
        }, POOL_KEY)
        steps = len(PHASES)

        def on_phase(phase: str) -> None:
            progress(PHASES.index(phase) if phase in PHASES else 0, steps, _PHASE_WORDS.get(phase, phase))
            if phase == "census":
                self._answer_census(w, rid, problem, source, opts, cid)

        reply = _Reply(w, rid, key, lambda phase: self._limit(phase, opts), "request", "the result channel")
        try:
            payload, retire = reply.read(on_phase)
            result = VerifyResult.model_validate(payload)
            if result.candidate_id != cid or result.problem_hash != problem.hash:
                raise ForgedFrame("the result names another candidate or problem than the one sent")
        except TimeoutError:
            phase = reply.phase
            return self._ended(w, problem, source, opts, cid, t0, Verdict.timeout, phase,
                               f"timeout: no answer within {self._limit(phase, opts):.0f} s while "
                               f"{_PHASE_WORDS.get(phase, phase)}; the worker was killed and replaced")
        except ChannelClosed:
            phase = reply.phase
            code = w.proc.wait(timeout=30)
            return self._ended(w, problem, source, opts, cid, t0, Verdict.crashed, phase,
                               f"crashed: the worker died ({describe_exit(code)}) while "
                               f"{_PHASE_WORDS.get(phase, phase)}; it was replaced")
        except (ForgedFrame, ValidationError) as exc:
            finding = Finding(
                code=FindingCode.forged_result, source="runtime",
                message=(f"the result channel carried data the harness did not send ({exc}); writing to the "
                         "worker's channel or faking its messages is not allowed"),
            )
            return self._ended(w, problem, source, opts, cid, t0, Verdict.invalid, reply.phase,
                               f"invalid (forged_result): {finding.message}", [finding])
        w.output.settle()
        result = result.model_copy(update={
            "output": w.output.take(opts.max_output_chars),
            "elapsed_s": round(time.monotonic() - t0, 3),
            "worker_replaced": retire,
        })
        if retire:
            self._replace(w)
        progress(steps, steps, result.verdict.value)
        return result

    # -- the kernel census --------------------------------------------------------------------

    def census(self, problem: Problem, source: str, options: VerifyOptions | None = None) -> CensusReply:
        """The kernel census of one forward of `source`, taken in the census worker (started if
        needed). `verify` takes it itself, between the checks and the timing; this entry point
        serves callers that want the census alone. Never raises for a misbehaving candidate (the
        reply's verdict says what happened); raises WorkerError when no census worker starts."""
        opts = options or VerifyOptions()
        with self._lock:
            return self._take_census(problem, source, opts, candidate_id(problem, source))

    def _census_worker(self) -> _Worker:
        for attempt in range(2):
            w = self._census
            if w is None or not w.alive():
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

    def _replace_census(self, w: _Worker) -> None:
        self._drop(w)
        self.census_restarts += 1
        self._census = self._new("census")

    def _census_limit(self, phase: str, opts: VerifyOptions) -> float:
        return opts.compile_timeout_s if phase in ("queued", "import", "construct") else opts.timeout_s

    def _take_census(self, problem: Problem, source: str, opts: VerifyOptions, cid: str) -> CensusReply:
        t0 = time.monotonic()
        rid = uuid.uuid4().hex
        key = new_key()
        request = {
            "op": "census", "rid": rid, "key": key.hex(), "problem": problem.model_dump(mode="json"),
            "source": source, "options": opts.model_dump(mode="json"), "candidate_id": cid,
        }
        for attempt in range(2):
            w = self._census_worker()
            w.output.reset()
            try:
                send(w.sock, request, POOL_KEY)
                break
            except OSError:  # it died while idle (killed from outside): a fresh one takes the request
                if attempt:
                    raise WorkerError("the census worker does not take requests") from None
                self._replace_census(w)
        where = "the census worker runs one forward under the profiler, in a process of its own"
        exchange = _Reply(w, rid, key, lambda phase: self._census_limit(phase, opts), "census",
                          "the census worker's channel")
        try:
            payload, retire = exchange.read(lambda phase: None)
            reply = CensusReply.model_validate(payload)
        except TimeoutError:
            phase = exchange.phase
            self._replace_census(w)
            return CensusReply(
                verdict=Verdict.timeout, elapsed_s=round(time.monotonic() - t0, 3),
                summary=(f"timeout: no answer within {self._census_limit(phase, opts):.0f} s while "
                         f"{CENSUS_WORDS.get(phase, phase)} ({where}); it was killed and replaced"),
            )
        except ChannelClosed:
            phase = exchange.phase
            code = w.proc.wait(timeout=30)
            self._replace_census(w)
            return CensusReply(
                verdict=Verdict.crashed, elapsed_s=round(time.monotonic() - t0, 3),
                summary=(f"crashed: the census worker died ({describe_exit(code)}) while "
                         f"{CENSUS_WORDS.get(phase, phase)} ({where}); it was replaced"),
            )
        except (ForgedFrame, ValidationError) as exc:
            self._replace_census(w)
            finding = Finding(
                code=FindingCode.forged_result, source="runtime",
                message=(f"the census worker's channel carried data the harness did not send ({exc}); writing "
                         "to the harness's channels or faking its messages is not allowed"),
            )
            return CensusReply(findings=[finding], verdict=Verdict.invalid, elapsed_s=round(time.monotonic() - t0, 3),
                               summary=f"invalid (forged_result): {finding.message}")
        if retire:
            self._replace_census(w)
        return reply.model_copy(update={"elapsed_s": round(time.monotonic() - t0, 3)})

    def _answer_census(self, w: _Worker, rid: str, problem: Problem, source: str, opts: VerifyOptions,
                       cid: str) -> None:
        """Takes the census for the verify worker `w` (waiting on request `rid`) and answers it,
        once nothing else of the pool is starting up (the verify worker times right after)."""
        try:
            reply = self._take_census(problem, source, opts, cid)
        except WorkerError:
            self._replace(w)  # it waits for an answer that will not come
            raise
        if reply.clean:
            self._settle_starts()
        try:
            send(w.sock, {"op": "census", "rid": rid, "reply": reply.model_dump(mode="json")}, POOL_KEY)
        except OSError:
            pass  # the verify worker is gone: the next read says how

    def _ended(self, w: _Worker, problem: Problem, source: str, opts: VerifyOptions, cid: str, t0: float,
               verdict: Verdict, phase: str, summary: str, findings: list[Finding] | None = None) -> VerifyResult:
        """The result when the worker did not answer properly: it is replaced, the verdict says why."""
        self._replace(w)
        w.output.settle()
        built = phase in ("check", "census", "timing", "baselines")
        compile = CompileResult(
            ok=built,
            style=style_of(static_units(source)),
            messages=[] if built else [f"the build did not finish: the worker ended while {_PHASE_WORDS.get(phase, phase)}"],
        )
        return VerifyResult(
            candidate_id=cid, problem=problem.name, problem_hash=problem.hash, verdict=verdict, summary=summary,
            compile=compile, findings=findings or [], phase=phase, output=w.output.take(opts.max_output_chars),
            elapsed_s=round(time.monotonic() - t0, 3), worker_replaced=True,
        )
