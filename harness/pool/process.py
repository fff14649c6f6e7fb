"""One sandboxed worker process, as the pool holds it: its channel, its captured output, its end.

The worker is `python -m kb_mcp.harness.worker.main`, started through `harness.sandbox.sandbox` (its own
scratch folder, the shared cache's published builds and baselines read-only, the GPU where
there is one). Its stdout and stderr are a pipe this process drains continuously, keeping the
head and tail of each request's output (a candidate that floods its output costs nothing but CPU).
`ReplyReader` reads one request's answer from it, frame by frame.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kb_mcp.harness.protocol import (
    FROM_WORKER,
    BuildAsk,
    CensusAsk,
    ExitRequest,
    Hello,
    Init,
    Phase,
    ResultFrame,
    WorkerInfo,
)
from kb_mcp.harness.sandbox.attempts import AttemptLog
from kb_mcp.harness.sandbox.channel import POOL_KEY, ChannelError, ForgedFrame, FrameReader, new_key, send
from kb_mcp.harness.sandbox.sandbox import Grant, Sandbox, kill_group
from kb_mcp.harness.sandbox.scratch import new_scratch
from kb_mcp.harness.sandbox.watch import watch_of

HEAD_BYTES = 64 << 10  # output kept from the start of a request...
TAIL_BYTES = 64 << 10  # ...and from its end


class WorkerError(RuntimeError):
    """The worker process could not be started or answered nonsense to a harmless request."""


def describe_exit(code: int | None) -> str:
    """'killed by SIGSEGV' / 'exit status 3' for a process return code."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code > 128 and code - 128 < 65:  # the sandbox reports a child killed by a signal this way
        try:
            return f"killed by {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exit status {code}"


def kill_all(workers: list[WorkerProcess]) -> None:
    """Kills every worker of the list (a pool's finalizer, at interpreter exit: best effort)."""
    for w in workers:
        try:
            w.kill()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class Output:
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


@contextlib.contextmanager
def following(seen: AttemptLog, *workers: WorkerProcess | None) -> Iterator[None]:
    """Reports the attempts of these (warm) workers to `seen` during the block; workers started in
    it report there anyway (`attempts.collecting`)."""
    watches = [wt for w in workers if w is not None for wt in [watch_of(w.proc)] if wt is not None]
    for wt in watches:
        wt.follow(seen)
    try:
        yield
    finally:
        for wt in watches:
            wt.unfollow(seen)


class WorkerProcess:
    """One worker process in its sandbox, and its channel."""

    def __init__(self, sandbox: Sandbox, cache_dir: Path, no_cuda: bool, role: str = "verify") -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.scratch = new_scratch(f"worker-{role}")
        argv = [sys.executable, "-m", "kb_mcp.harness.worker.main", "--channel-fd", str(child.fileno()),
                "--cache-dir", str(cache_dir), "--scratch", str(self.scratch), "--role", role]
        if no_cuda:
            argv.append("--no-cuda")
        if sandbox.confined:
            argv.append("--own-pid-namespace")
        # The published builds and the baselines are read here; only the server writes them.
        grant = Grant(role="worker", scratch=self.scratch, gpu=not no_cuda,
                      ro=(cache_dir / "torch_extensions", cache_dir / "baselines"))
        self.role = role
        out_r, out_w = os.pipe()
        try:
            self.proc = sandbox.popen(argv, grant, stdout=out_w, stderr=out_w, pass_fds=(child.fileno(),))
        except BaseException:
            os.close(out_r)
            parent.close()
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        finally:
            child.close()
            os.close(out_w)
        self.sock = parent
        self.reader = FrameReader(parent)
        self.output = Output(out_r)
        self.session = new_key()
        self.info: WorkerInfo | None = None
        self.started = time.monotonic()
        self.served = 0  # candidates sent to it: a census worker that served none is untouched by them
        try:
            send(parent, Init(key=self.session.hex()), POOL_KEY)
        except OSError:
            # It died at once (its Python could not start: a broken site, a missing library), before
            # it read this: `wait_ready` reads the closed channel and says how it ended, from its exit
            # status and output, as for any worker that failed to start (a BrokenPipeError here had
            # escaped as a traceback, and a cluster did not withdraw the worker whose harness cannot run).
            pass

    @property
    def pid(self) -> int:
        """The process the pool started (the sandbox's outer process)."""
        return self.proc.pid

    def wait_ready(self, timeout_s: float) -> WorkerInfo:
        """The worker's hello (device, torch version), waiting for its start-up."""
        if self.info is None:
            try:
                hello = self.reader.read_message(FROM_WORKER, self.session, time.monotonic() + timeout_s)
            except TimeoutError as exc:
                self.kill()
                raise WorkerError(f"the harness worker did not start within {timeout_s:.0f} s") from exc
            except ChannelError as exc:
                code = self.proc.wait(timeout=10)
                self.output.settle()
                raise WorkerError(
                    f"the harness worker failed to start ({describe_exit(code)}): {self.output.take(2000)}"
                ) from exc
            if not isinstance(hello, Hello):
                self.kill()
                raise WorkerError(f"the harness worker answered {hello.kind!r} instead of hello")
            self.info = hello.info.model_copy(update={"pid": self.pid})
        return self.info

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def starting(self) -> bool:
        """True while the process runs but has not said hello yet (it is initialising CUDA)."""
        return self.info is None and self.alive()

    def kill(self) -> None:
        """Kills the worker and everything it started (compilers included), and removes its scratch."""
        kill_group(self.proc)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process stuck in the driver
            pass
        self.sock.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Asks the worker to exit, then kills it if it does not."""
        if self.proc.poll() is None:
            try:
                send(self.sock, ExitRequest(), POOL_KEY)
                self.proc.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


class ReplyReader:
    """Reading one request's answer from a worker: phase frames and asks, then the result frame.

    Every frame must carry the request id and the next sequence number (else `ForgedFrame`); each
    phase frame is passed to `on_phase` and restarts the deadline with that phase's limit; an ask
    (census, build) is answered by `on_ask`, and the deadline restarts after it. `phase` says where
    the worker was when reading ended. Raises what `FrameReader.read` raises: TimeoutError,
    ChannelClosed, ForgedFrame.
    """

    def __init__(self, w: WorkerProcess, rid: str, key: bytes, limit: Callable[[str], float], what: str) -> None:
        self.w = w
        self.rid = rid
        self.key = key
        self.limit = limit
        self.what = what  # "request" / "census": how an out-of-sequence frame is named
        self.phase = "queued"

    def read(self, on_phase: Callable[[str], None], on_ask: Callable[[Any], None]) -> ResultFrame:
        """The result frame, once it arrives."""
        deadline = time.monotonic() + self.limit(self.phase)
        seq = 0
        while True:
            frame = self.w.reader.read_message(FROM_WORKER, self.key, deadline)
            if getattr(frame, "rid", None) != self.rid or getattr(frame, "seq", None) != seq:
                raise ForgedFrame(
                    f"a {frame.kind} frame for request {str(getattr(frame, 'rid', ''))[:12]}, number "
                    f"{getattr(frame, 'seq', None)} arrived where number {seq} of this {self.what} was due"
                )
            seq += 1
            if isinstance(frame, Phase):
                self.phase = frame.phase
                on_phase(self.phase)
            elif isinstance(frame, (CensusAsk, BuildAsk)):
                on_ask(frame)
            elif isinstance(frame, ResultFrame):
                return frame
            else:  # pragma: no cover - FROM_WORKER admits nothing else with an rid
                raise ForgedFrame(f"unexpected frame {frame.kind!r}")
            deadline = time.monotonic() + self.limit(self.phase)
