"""Which part of the worker's process state changes launch-bound timings? (GPU)

    python bench/timing_env_probe.py [--out probe.json]

`bench/timing_fidelity.py` compares the harness's worker with a bare process; this probe splits the
difference. Each condition runs in a fresh interpreter and times, with the harness's `Timer`, the
40-launch eager reference of `elementwise_chain_small`, its fused load_inline and NVRTC candidates,
and an empty call (the timer's floor):

  bare            Timer + trusted snapshot + builders (as the fidelity bench's bare process)
  +dynamo         and torch._dynamo / inductor imported, nn.Module.__init__ tagging installed
  +gc.freeze      and the start-up heap frozen, collector paused in the series
  +1 idle ctx     while one other idle process holds a CUDA context on the GPU
  +2 idle ctx     while two do (the pool runs a spare and a census worker beside the timing one)
  worker setup    after the worker's own `_setup` (everything a verify worker does at start)
  pool            through `WorkerPool.verify` (spare and census workers alive)
  pool, no spare  the same without the spare worker
  +standby        while a profiling driver waits under ncu for its next request (what a server
                  keeps after each profile_kernel call; `--standby-only` runs just bare/+standby,
                  alternating, twice)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "examples" / "problems" / "elementwise_chain_small.py"
CANDIDATES = {
    "chain load_inline": ROOT / "examples" / "candidates" / "elementwise_chain_small_load_inline.py",
    "chain NVRTC": ROOT / "examples" / "candidates" / "elementwise_chain_small_nvrtc.py",
}
RUNS = 60
IDLE = ("import torch, time; torch.zeros(1, device='cuda'); torch.cuda.synchronize(); print('ready', flush=True); "
        "time.sleep(600)")


def _condition(name: str, cache: str) -> dict[str, Any]:
    """Runs in a fresh interpreter: applies condition `name`, then times the callables."""
    import gc

    import torch

    from kb_mcp.harness.worker.compile import Builders
    from kb_mcp.harness.worker.integrity_runtime import TrustedSnapshot
    from kb_mcp.harness.worker.loading import load_module
    from kb_mcp.harness.worker.timing import L2Flusher, Timer, guards_active, paused_gc

    props = torch.cuda.get_device_properties(0)
    if name == "worker setup":
        from kb_mcp.harness.worker import main as worker_main

        env, _ = worker_main._setup(Path(cache), Path(tempfile.mkdtemp(prefix="kbmcp-probe-")), False, "verify")
        timer = env.timer
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        Builders(
            Path(cache), f"sm_{props.major}{props.minor}", local_dir=Path(tempfile.mkdtemp(prefix="kbmcp-probe-ext-"))
        ).install()
        if name in ("+dynamo", "+gc.freeze"):
            import torch._dynamo
            import torch._inductor.config
            from torch._dynamo.mutation_guard import install_generation_tagging_init

            install_generation_tagging_init()
        if name == "+gc.freeze":
            gc.collect()
            gc.freeze()
        timer = Timer(TrustedSnapshot.capture().trusted, L2Flusher(int(props.L2_cache_size)))
    work = Path(tempfile.mkdtemp(prefix="kbmcp-probe-"))
    problem = load_module(PROBLEM.read_text(), "probe_problem", work)
    ref = problem.Model().cuda().eval()

    def make(i: int) -> list[Any]:
        torch.manual_seed(1000 + i)
        with torch.device("cuda"):
            return list(problem.get_inputs())

    def median(fn: Any) -> float:
        with paused_gc():
            return round(timer.series(fn, make, RUNS, 3).median_ms * 1000, 1)

    out: dict[str, Any] = {"guards": guards_active()}
    with torch.no_grad():
        out["floor"] = median(lambda *a: None)
        out["eager"] = median(ref)
        for i, (label, path) in enumerate(CANDIDATES.items()):
            mod = load_module(path.read_text(), f"probe_cand_{i}", work)
            out[label] = median(mod.ModelNew().cuda().eval())
    return out


def _in_subprocess(name: str, cache: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--condition", name, "--cache", cache], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        return {"error": proc.stderr[-1500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _with_idle(n: int, name: str, cache: str) -> dict[str, Any]:
    idle = [subprocess.Popen([sys.executable, "-c", IDLE], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        for p in idle:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return _in_subprocess(name, cache)
    finally:
        for p in idle:
            p.kill()
            p.wait()


def _with_standby(name: str, cache: str) -> dict[str, Any]:
    """`name` timed while a profiling driver waits under ncu, as `profile_kernel` leaves one."""
    from kb_mcp.harness.sandbox.sandbox import detect
    from kb_mcp.profiling import ncu_parse, profiler
    from kb_mcp.profiling.profile_standby import StandbyKey, StandbyPool

    ncu = profiler.find_ncu()
    if ncu is None:
        return {"error": "no ncu on this machine"}
    pool = StandbyPool(Path(tempfile.mkdtemp(prefix="kbmcp-probe-standby-")))
    spawner = profiler.Spawner(detect(), None, ncu)
    key = StandbyKey(ncu, False, 200, tuple(ncu_parse.requested_metrics()), "")
    try:
        if pool.launch(key, profiler.standby_launcher(ncu, key, pool, spawner)) is None or not pool.wait_ready(120):
            return {"error": "the profiling driver did not get ready"}
        return _in_subprocess(name, cache)
    finally:
        pool.close()


def _pool(cache: str, spare: bool) -> dict[str, Any]:
    from kb_mcp.harness.judgment.verdict import VerifyOptions
    from kb_mcp.harness.pool.pool import WorkerPool
    from kb_mcp.harness.problem import load_problem

    problem = load_problem(PROBLEM)
    out: dict[str, Any] = {}
    with WorkerPool(cache, spare=spare) as pool:
        for label, path in CANDIDATES.items():
            res = pool.verify(problem, path.read_text(), VerifyOptions(compile_baseline=False))
            t = res.timings
            out["eager"] = round(t.eager_ms * 1000, 1) if t and t.eager_ms else None
            out[label] = round(t.candidate_ms * 1000, 1) if t and t.candidate_ms else res.summary[:120]
    return out


def main(argv: list[str] | None = None) -> int:
    """Runs every condition and prints one table (microseconds, medians)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--cache", default=None)
    parser.add_argument("--condition", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--standby-only", action="store_true", help="only bare and +standby, alternating")
    args = parser.parse_args(argv)
    if args.condition:
        print(json.dumps(_condition(args.condition, args.cache)))
        return 0
    cache = args.cache or tempfile.mkdtemp(prefix="kbmcp-probe-cache-")
    rows: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    if args.standby_only:
        _in_subprocess("bare", cache)  # builds the load_inline candidate into the cache
        for i in (1, 2):
            rows[f"bare #{i}"] = _in_subprocess("bare", cache)
            rows[f"+standby #{i}"] = _with_standby("bare", cache)
    else:
        rows["pool"] = _pool(cache, spare=True)  # first: builds the load_inline candidate into the cache
        rows["pool, no spare"] = _pool(cache, spare=False)
        for name in ("bare", "+dynamo", "+gc.freeze", "worker setup"):
            rows[name] = _in_subprocess(name, cache)
        rows["+1 idle ctx"] = _with_idle(1, "bare", cache)
        rows["+2 idle ctx"] = _with_idle(2, "bare", cache)
        rows["+standby"] = _with_standby("bare", cache)
    cols = ["floor", "eager", *CANDIDATES]
    print(f"{'condition (median us)':<18}" + "".join(f"{c:>20}" for c in cols))
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:<18} error: {row['error'][-300:]}")
            continue
        print(f"{name:<18}" + "".join(f"{row.get(c, '-')!s:>20}" for c in cols) + f"  {row.get('guards') or ''}")
    print(f"total {time.perf_counter() - t0:.1f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
