"""Entry point of a worker process:
`python -m kb_mcp.harness.worker.main --channel-fd N --cache-dir DIR --scratch DIR [--role R] [--no-cuda]`.

Started by `harness.pool.pool.WorkerPool` inside the sandbox (`harness.sandbox.sandbox`: a fresh interpreter,
never a fork of the server). It initialises torch and CUDA once (TF32 off, builders installed,
trusted functions captured before any candidate), then serves requests from the private channel,
one at a time, answering only with `harness.protocol` messages. stdout and stderr belong to the
candidates (the pool captures and truncates them). A worker exits after a candidate that may have
left it unfit (a CUDA error, tampering, a leftover thread or process); the pool starts a fresh one.

Two roles. `verify` (the default) checks and times candidates and the reference baselines; it
never starts a profiler session
(`integrity_runtime.forbid_profiler`), so that its timings are those of a clean PyTorch process.
`census` only takes kernel censuses (`harness.worker.census`): its first profiler session is paid
at start. A verify worker that reaches the census asks the pool, which asks the census worker and
answers on the channel before the timing starts.

The worker writes only into its scratch folder. Builds of `load_inline` extensions are asked of
the pool (`BuildAsk`), which builds them in a sandbox of their own and publishes them read-only.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import resource
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kb_mcp.harness.protocol import (
    TO_WORKER,
    BaselineRequest,
    BuildAnswer,
    BuildAsk,
    BuildReply,
    CensusAnswer,
    CensusAsk,
    CensusReply,
    CensusRequest,
    ExitRequest,
    Hello,
    Init,
    Phase,
    PingReply,
    PingRequest,
    ProblemChecked,
    ProblemFailed,
    ProblemRequest,
    ResultFrame,
    VerifyReply,
    VerifyRequest,
    WorkerInfo,
)
from kb_mcp.harness.sandbox.channel import POOL_KEY, ChannelClosed, FrameReader, send


def _hide_fd(fd: int) -> int:
    """Moves the channel to a random high descriptor, not inherited by compiler subprocesses."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard if hard != resource.RLIM_INFINITY else 65536, 65536)
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    for _ in range(50):
        target = random.SystemRandom().randrange(max(256, soft // 4), soft)
        try:
            os.fstat(target)
        except OSError:
            os.dup2(fd, target, inheritable=False)
            os.close(fd)
            return target
    os.set_inheritable(fd, False)
    return fd


def compile_baseline_in_process() -> None:
    """Makes torch.compile (the baseline) compile inside this process, starting no threads.

    Inductor's parallel compile starts pool and timer threads lazily (`subproc_worker_timer`,
    executor threads), and its progress bar (tqdm, where installed) a `tqdm_monitor` thread even when
    disabled; the thread census would blame them on the problem or the next candidate and retire the
    worker after every torch.compile (a new worker's start, ~8 s under the GPU lane, per problem).
    """
    import torch._inductor.config

    torch._inductor.config.compile_threads = 1
    try:
        import tqdm  # type: ignore[import-untyped]
    except ImportError:  # torch then uses a stand-in that starts no thread
        return
    tqdm.tqdm.monitor_interval = 0  # tqdm's documented switch: no monitor thread


class Channel:
    """This worker's side of the channel: answers to the pool, and questions it waits on."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = FrameReader(sock)
        self._key = b""
        self._rid = ""
        self._seq = itertools.count()

    def begin(self, rid: str, key: bytes) -> None:
        """A new request: its frames are signed with `key` and numbered from 0."""
        self._rid, self._key, self._seq = rid, key, itertools.count()

    def emit(self, make: Callable[..., Any], **fields: Any) -> None:
        """Sends one numbered frame of the current request's answer."""
        send(self.sock, make(rid=self._rid, seq=next(self._seq), **fields), self._key)

    def phase(self, name: str) -> None:
        """Progress: the request moved on to `name` (the pool's limit follows the phase)."""
        self.emit(Phase, phase=name)

    def ask_census(self, counters: bool = False, units: list[Any] | None = None) -> CensusReply:
        """The kernel census of the current candidate, from the pool's census worker; with
        `counters`, its work census (hardware counters of one forward, `profiling.work`). `units` (the
        candidate's builds, `candidate.SourceUnit`) are what the server reads the SASS of."""
        self.emit(CensusAsk, counters=counters, units=list(units or []))
        msg = self.reader.read_message(TO_WORKER, POOL_KEY)
        if not isinstance(msg, CensusAnswer) or msg.rid != self._rid:
            raise RuntimeError(f"the pool sent {msg.kind!r} where the census for this request was due")
        return msg.reply

    def ask_build(self, unit: Any, arch: str) -> BuildReply:
        """A `load_inline` extension built by the pool's build service (published read-only)."""
        self.emit(BuildAsk, unit=unit, arch=arch)
        msg = self.reader.read_message(TO_WORKER, POOL_KEY)
        if not isinstance(msg, BuildAnswer) or msg.rid != self._rid:
            raise RuntimeError(f"the pool sent {msg.kind!r} where the build for this request was due")
        return msg.reply

    def end(self) -> None:
        """Forgets the request's key."""
        self._key = b""


def _setup(cache_dir: Path, scratch: Path, no_cuda: bool, role: str,
           ask_build: Callable[..., BuildReply] | None = None) -> tuple[Any, WorkerInfo]:
    """Initialises torch (and CUDA, when present) and everything the pipeline needs before candidates.
    `ask_build` has the pool build a missing extension; without it (a benchmark's process) missing
    extensions are built in the scratch folder."""
    import gc

    import torch

    from kb_mcp.harness.worker import census, checks, compile, integrity, integrity_runtime, timing, tracks, verify  # noqa: F401


    cuda = (not no_cuda) and torch.cuda.is_available()
    env = verify.WorkerEnv(cache_dir=cache_dir, scratch=scratch, cuda=cuda, role=role)
    if role != "census":
        integrity_runtime.forbid_profiler()
    if cuda:
        torch.zeros(1, device="cuda")
        # The strict track's numerics (TF32 off for matmul and cuDNN) until a verification asks
        # for its track's (`worker.tracks`): TF32 would hide a candidate's lowered precision.
        tracks.set_numerics(tracks.DEFAULT_TRACK)
        props = torch.cuda.get_device_properties(0)
        env.props = props
        env.device = props.name
        env.arch = f"sm_{props.major}{props.minor}"
        env.uuid = _uuid(props)
    if cuda or role == "census":
        # Builds go through the pool: this process may not write the shared cache.
        env.builders = compile.Builders(cache_dir, env.arch or compile.DEFAULT_ARCH, ask_build,
                                        local_dir=None if ask_build else scratch / "extensions")
        env.builders.install()
    if cuda:
        # Modules the torch.compile baseline loads later are loaded now, before the trusted snapshot,
        # so that whatever they set up is part of the pristine state rather than a change after it.
        import torch._dynamo
        compile_baseline_in_process()

        try:  # what the first torch.compile would patch into nn.Module
            from torch._dynamo.mutation_guard import install_generation_tagging_init

            install_generation_tagging_init()
        except ImportError:  # pragma: no cover - other torch versions
            pass

        if role == "census":
            # The first profiler session costs seconds (CUPTI start-up): paid here, not in a verdict.
            integrity_runtime.census(lambda: torch.zeros(16, device="cuda").add_(1))
        env.snapshot = integrity_runtime.TrustedSnapshot.capture()
        if role != "census":
            env.timer = timing.Timer(env.snapshot.trusted, timing.L2Flusher(int(env.props.L2_cache_size)))
            env.timer.calibrate()
    elif role == "census":
        env.snapshot = integrity_runtime.TrustedSnapshot.capture()
    env.start_guards = tuple(timing.guards_active())
    # The harness's own heap (torch, dynamo, pydantic) never becomes garbage: keep the cyclic
    # collector from walking it again and again.
    gc.collect()
    gc.freeze()
    info = WorkerInfo(
        pid=os.getpid(), sandbox_pid=os.getpid(), role=role, cuda=cuda, device=env.device, arch=env.arch,
        torch_version=torch.__version__, python=sys.version.split()[0], uuid=env.uuid,
    )
    return env, info


def _uuid(props: Any) -> str:
    """The device's UUID as the driver writes it (`GPU-xxxxxxxx-...`), or '' where torch has none."""
    raw = getattr(props, "uuid", None)
    if raw is None:
        return ""
    text = str(raw)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def _left_running(before: set[threading.Thread], baseline: set[int] | None) -> str:
    """What the request left running in this worker ('' when nothing): threads started and not
    ended, and (in a PID namespace of its own) processes, by name, so a retirement says why."""
    threads = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    procs = sorted(_processes() - baseline) if baseline is not None else []
    parts = []
    if threads:
        parts.append(f"{len(threads)} thread(s) ({', '.join(threads[:4])[:160]})")
    if procs:
        parts.append(f"{len(procs)} process(es) ({', '.join(_comm(p) for p in procs[:4])[:160]})")
    return " and ".join(parts) + " left running" if parts else ""


def _comm(pid: int) -> str:
    try:
        return f"{Path(f'/proc/{pid}/comm').read_text().strip()}[{pid}]"
    except OSError:
        return str(pid)


def _processes() -> set[int]:
    """The processes this worker can see besides itself (in its sandbox: only its own descendants)."""
    me = os.getpid()
    seen: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (me, 1):
            seen.add(int(entry))
    return seen


def _handle(env: Any, req: Any, channel: Channel) -> tuple[Any, bool]:
    """Runs one request; (result body, retire)."""
    from kb_mcp.harness.worker import census, verify

    if isinstance(req, CensusRequest):
        return census.run_census(env, req.problem, req.source, req.options, channel.phase, req.reference_device,
                                 req.reference_ops)
    if isinstance(req, ProblemRequest):
        return _check_problem(env, req.problem), False
    if isinstance(req, BaselineRequest):
        from kb_mcp.harness.worker.baseline_run import run_baselines

        if not env.cuda:
            raise RuntimeError("this worker has no GPU: baselines are timed on a GPU only")
        return run_baselines(env, req.problem, req.options, channel.phase)
    assert isinstance(req, VerifyRequest)
    if not env.cuda:
        raise RuntimeError("this worker has no GPU: the pool checks candidates without one itself (compile-only)")
    run = verify.GpuVerification(env, req.problem, req.source, req.options, req.candidate_id, channel.phase,
                                 channel.ask_census, req.baseline)
    outcome, retire = run.run()
    if isinstance(outcome, ProblemFailed):
        return outcome, retire
    return VerifyReply(result=outcome, baseline=run.new_baseline, reference_ops=run.new_reference_ops), retire


def _check_problem(env: Any, problem: Any) -> ProblemChecked | ProblemFailed:
    """Imports the problem and makes its init inputs (the compile-only path's check of the problem)."""
    from kb_mcp.harness.worker.loading import load_module, short_traceback

    name = f"kbmcp_problem_check_{next(env.counter)}"
    files = (str(env.workdir / f"{name}.py"),)
    try:
        try:
            module = load_module(problem.source, name, env.workdir)
        except Exception as exc:  # noqa: BLE001 - the problem's code: anything may go wrong
            return ProblemFailed(stage="import", error=short_traceback(exc, files))
        try:
            list(module.get_init_inputs())
        except Exception as exc:  # noqa: BLE001 - the problem's code: anything may go wrong
            return ProblemFailed(stage="inputs", error=short_traceback(exc, files))
        return ProblemChecked()
    finally:
        sys.modules.pop(name, None)


def _internal_error(req: Any, exc: BaseException) -> Any:
    """The reply when the harness itself raised on `req`: a crash, worded by `verdict.judge`."""
    from kb_mcp.harness.judgment.verdict import Evidence, Failure, FailureKind, VerifyResult, judge

    detail = f"{type(exc).__name__}: {str(exc)[:300]}"
    if isinstance(req, CensusRequest):
        return CensusReply(failure=Failure(kind=FailureKind.census_internal_error, detail=detail), pid=os.getpid())
    evidence = Evidence(failure=Failure(kind=FailureKind.internal_error, detail=detail))
    judgement = judge(evidence)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]
    problem = getattr(req, "problem", None)
    return VerifyReply(result=VerifyResult(
        candidate_id=str(getattr(req, "candidate_id", "")), problem=problem.name if problem else "",
        problem_hash=problem.hash if problem else "", verdict=judgement.verdict, summary=judgement.summary,
        compile=evidence.compile, output=text,
    ))


def main(argv: list[str] | None = None) -> int:
    """Serves requests until the pool says exit or closes the channel."""
    parser = argparse.ArgumentParser(prog="kb_mcp.harness.worker.main")
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--cache-dir", required=True, help="the shared cache (read-only here)")
    parser.add_argument("--scratch", required=True, help="this worker's writable folder")
    parser.add_argument("--no-cuda", action="store_true", help="compile-only worker even where a GPU is present")
    parser.add_argument("--role", choices=("verify", "census"), default="verify",
                        help="verify: check and time candidates (never profiles); census: kernel censuses only")
    parser.add_argument("--own-pid-namespace", action="store_true",
                        help="every other process visible is this worker's own (a process left running retires it)")
    args = parser.parse_args(argv)

    channel = Channel(socket.socket(fileno=_hide_fd(args.channel_fd)))
    init = channel.reader.read_message(TO_WORKER, POOL_KEY, deadline=time.monotonic() + 120)
    if not isinstance(init, Init):
        return 2
    session = bytes.fromhex(init.key)
    env, info = _setup(Path(args.cache_dir), Path(args.scratch), args.no_cuda, args.role, channel.ask_build)
    send(channel.sock, Hello(info=info), session)
    del session, init
    baseline = _processes() if args.own_pid_namespace else None

    while True:
        try:
            req = channel.reader.read_message(TO_WORKER, POOL_KEY)
        except ChannelClosed:
            return 0
        if isinstance(req, ExitRequest):
            return 0
        if not isinstance(req, (VerifyRequest, CensusRequest, BaselineRequest, ProblemRequest, PingRequest)):
            return 2  # an answer nobody asked for: the pool is confused, start afresh
        channel.begin(req.rid, bytes.fromhex(req.key))
        if isinstance(req, PingRequest):
            from kb_mcp.harness.worker.integrity_runtime import profiler_sessions

            channel.emit(ResultFrame, body=PingReply(info=info, profiler_sessions=profiler_sessions()))
            continue
        if isinstance(req, CensusRequest) != (args.role == "census"):
            channel.emit(ResultFrame, body=_internal_error(req,
                                                      RuntimeError(f"a {args.role} worker got a {req.kind!r} request")),
                         retire=True)
            return 0
        retire = False
        before = set(threading.enumerate())
        try:
            body, retire = _handle(env, req, channel)
        except BaseException as exc:  # noqa: BLE001 - report anything, then let the pool replace us
            body, retire = _internal_error(req, exc), True
        # A thread or process the candidate left running could write into the next request (or read
        # the next candidate's files): start afresh.
        why = _left_running(before, baseline)
        retire = retire or bool(why)
        env.clean_workdir()
        sys.stdout.flush()
        sys.stderr.flush()
        channel.emit(ResultFrame, body=body, retire=retire, why_retire=why)
        channel.end()
        if retire:
            return 0


if __name__ == "__main__":
    sys.exit(main())
