"""Entry point of a worker process: `python -m kb_mcp.harness.worker_main --channel-fd N --cache-dir DIR [--role R]`.

Started by `harness.worker.WorkerPool` (a fresh interpreter, never a fork of the server). It
initialises torch and CUDA once (TF32 off, builders installed, trusted functions captured before
any candidate), then serves requests from the private channel, one at a time. stdout and stderr
belong to the candidates (the pool captures and truncates them); results go only through the
channel. A worker exits after a candidate that may have left it unfit (a CUDA error, tampering, a
leftover thread); the pool starts a fresh one.

Two roles. `verify` (the default) checks and times candidates and the reference baselines; it never
starts a profiler session (`integrity_runtime.forbid_profiler`), so that its timings are those of
a clean PyTorch process. `census` only takes kernel censuses (`harness.census`): its first
profiler session is paid at start. A verify worker that reaches the census asks the pool, which
asks the census worker and answers on the channel before the timing starts.
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
from pathlib import Path
from typing import Any

from kb_mcp.harness.channel import POOL_KEY, ChannelClosed, FrameReader, send


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
    `tqdm_monitor`, executor threads); the thread census would blame them on the next candidate.
    """
    import torch._inductor.config

    torch._inductor.config.compile_threads = 1


def _setup(cache_dir: Path, no_cuda: bool, role: str = "verify") -> tuple[Any, dict[str, Any]]:
    """Initialises torch (and CUDA, when present) and everything the pipeline needs before candidates."""
    import gc

    import torch

    from kb_mcp.harness import baselines, census, compile, integrity, integrity_runtime, timing, verify  # noqa: F401

    workdir = cache_dir / "work" / str(os.getpid())
    workdir.mkdir(parents=True, exist_ok=True)
    cuda = (not no_cuda) and torch.cuda.is_available()
    env = verify.WorkerEnv(cache_dir=cache_dir, workdir=workdir, cuda=cuda, role=role)
    if role != "census":
        integrity_runtime.forbid_profiler()
    if cuda:
        torch.zeros(1, device="cuda")
        # The reference computes fp32 in fp32: TF32 would hide a candidate's lowered precision.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        props = torch.cuda.get_device_properties(0)
        env.props = props
        env.device = props.name
        env.arch = f"sm_{props.major}{props.minor}"
        env.builders = compile.Builders(cache_dir, env.arch)
        env.builders.install()
        # Modules the torch.compile baseline loads later are loaded now, before the trusted snapshot,
        # so that whatever they set up is part of the pristine state rather than a change after it.
        import torch._dynamo  # noqa: F401
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
            env.timer = timing.Timer(env.snapshot.trusted, timing.L2Flusher(int(props.L2_cache_size)))
            env.timer.calibrate()
    elif role == "census":
        env.snapshot = integrity_runtime.TrustedSnapshot.capture()
    env.start_guards = tuple(timing.guards_active())
    # The harness's own heap (torch, dynamo, pydantic) never becomes garbage: keep the cyclic
    # collector from walking it again and again.
    gc.collect()
    gc.freeze()
    info = {
        "pid": os.getpid(),
        "role": role,
        "cuda": cuda,
        "device": env.device,
        "arch": env.arch,
        "torch_version": torch.__version__,
        "python": sys.version.split()[0],
    }
    return env, info


def await_census(reader: FrameReader, rid: str) -> dict[str, Any]:
    """The pool's census answer for request `rid` (a `CensusReply` as JSON), read from the channel."""
    msg = reader.read(POOL_KEY)
    if msg.get("op") != "census" or msg.get("rid") != rid:
        raise RuntimeError(f"the pool sent {msg.get('op')!r} where the census for this request was due")
    reply = msg.get("reply")
    if not isinstance(reply, dict):
        raise RuntimeError("the pool's census answer carries no reply")
    return reply


def _handle(env: Any, req: dict[str, Any], report: Any, ask_census: Any) -> tuple[Any, bool]:
    from kb_mcp.harness import census, verify
    from kb_mcp.harness.problem import Problem
    from kb_mcp.harness.verdict import VerifyOptions

    problem = Problem.model_validate(req["problem"])
    options = VerifyOptions.model_validate(req.get("options") or {})
    if req.get("op") == "census":
        return census.run_census(env, problem, req["source"], options, report)
    cid = str(req["candidate_id"])
    if env.cuda and not options.compile_only:
        return verify.GpuVerification(env, problem, req["source"], options, cid, report, ask_census).run()
    before = set(threading.enumerate())
    result = verify.compile_only_verification(env, problem, req["source"], options, cid, report)
    # A thread the candidate left running could write into the next request: start afresh.
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    return result, bool(leftover)


def _internal_error(req: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    from kb_mcp.harness.census import CensusReply
    from kb_mcp.harness.verdict import CompileResult, VerifyResult
    from kb_mcp.kb.models import Verdict

    if req.get("op") == "census":
        return CensusReply(
            verdict=Verdict.crashed, pid=os.getpid(),
            summary=f"crashed: internal error of the census worker ({type(exc).__name__}: {str(exc)[:300]}); it was replaced",
        ).model_dump(mode="json")
    problem = req.get("problem") or {}
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]
    return VerifyResult(
        candidate_id=str(req.get("candidate_id", "")), problem=str(problem.get("name", "")),
        problem_hash=str(problem.get("hash", "")), verdict=Verdict.crashed,
        summary=f"crashed: internal harness error ({type(exc).__name__}: {str(exc)[:300]}); the worker was replaced",
        compile=CompileResult(ok=True), output=text,
    ).model_dump(mode="json")


def main(argv: list[str] | None = None) -> int:
    """Serves requests until the pool says exit or closes the channel."""
    parser = argparse.ArgumentParser(prog="kb_mcp.harness.worker_main")
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--no-cuda", action="store_true", help="compile-only worker even where a GPU is present")
    parser.add_argument("--role", choices=("verify", "census"), default="verify",
                        help="verify: check and time candidates (never profiles); census: kernel censuses only")
    args = parser.parse_args(argv)

    sock = socket.socket(fileno=_hide_fd(args.channel_fd))
    reader = FrameReader(sock)
    init = reader.read(POOL_KEY, deadline=time.monotonic() + 120)
    session = bytes.fromhex(str(init["key"]))
    env, info = _setup(Path(args.cache_dir), args.no_cuda, args.role)
    send(sock, {"type": "hello", "info": info}, session)
    del session

    while True:
        try:
            req = reader.read(POOL_KEY)
        except ChannelClosed:
            return 0
        op = req.get("op")
        if op == "exit":
            return 0
        key = bytes.fromhex(str(req["key"]))
        rid = str(req["rid"])
        seq = itertools.count()

        def emit(kind: str, _key: bytes = key, _rid: str = rid, _seq: itertools.count = seq, **fields: Any) -> None:
            send(sock, {"type": kind, "rid": _rid, "seq": next(_seq), **fields}, _key)

        if op == "ping":
            from kb_mcp.harness.integrity_runtime import profiler_sessions

            emit("result", result={"info": info, "profiler_sessions": profiler_sessions()}, retire=False)
            continue
        if op not in ("verify", "census") or (op == "census") != (args.role == "census"):
            emit("result", result=_internal_error(req, RuntimeError(f"a {args.role} worker got a {op!r} request")),
                 retire=True)
            return 0
        retire = False
        try:
            result, retire = _handle(env, req, lambda phase: emit("phase", phase=phase),
                                     lambda _rid=rid: await_census(reader, _rid))
            payload = result.model_dump(mode="json")
        except BaseException as exc:  # noqa: BLE001 - report anything, then let the pool replace us
            payload, retire = _internal_error(req, exc), True
        del key
        sys.stdout.flush()
        sys.stderr.flush()
        emit("result", result=payload, retire=retire)
        if retire:
            return 0


if __name__ == "__main__":
    sys.exit(main())
