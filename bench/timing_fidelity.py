"""Timing fidelity: does the harness time a call in its worker as a bare PyTorch process would?

    python bench/timing_fidelity.py [--out results.json] [--cache DIR] [--sandbox on|off|both]

One run, on a GPU:
  (b) through `WorkerPool.verify` (verify worker, census worker beside it, default options except
      no torch.compile baseline): the eager reference and the example candidates
      (elementwise_chain_small: load_inline and NVRTC; swish: NVRTC);
  (a) then, with the pool closed, in a fresh subprocess per problem that imports nothing of the
      harness but its `Timer` (CUDA events, L2 flush, fresh inputs per run, median) and its
      builders (so that the load_inline build comes from the same cache): the same callables, as
      many runs as the worker took. Eager is timed first and again last in that process (drift).
      Then, in a phase of its own after every event timing (a profiler session raises the host
      cost of later launches), the device time of each callable, measured as the census worker
      measures it (`profiling.measure_device_time`: same runs, same summing function).
Prints bare and worker medians side by side with their ratio (target: within 5-10 %), the
device times bare and in the worker side by side (end-to-end launch-bound figures vary between
fresh processes by up to 1.5x, bare ones included; device times should agree), the speedups over
eager both ways, and where a one-kernel candidate's time goes in a bare process (timer floor,
allocation, stream lookup, the pybind call, the module call).

`--cache DIR` reuses a build cache (e.g. the adversarial suite's) so the load_inline candidate is
not built again; the baselines cached there are removed first, so eager is measured afresh.

`--sandbox both` runs (b) twice, with the workers in the sandbox (`on`, the default) and unconfined
(`off`, as `KB_MCP_SANDBOX=unconfined` would), one after the other on the same build cache (the
baselines removed before each), and prints both worker columns beside the bare one: what the
sandbox costs in timed calls. The bare process (a) is the reference and runs unconfined (the
example candidates are the project's own).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "examples" / "problems"
CANDIDATES = ROOT / "examples" / "candidates"

# (problem, [(label, candidate file)])
CASES: list[tuple[str, list[tuple[str, str]]]] = [
    ("elementwise_chain_small", [
        ("chain load_inline", "elementwise_chain_small_load_inline.py"),
        ("chain NVRTC", "elementwise_chain_small_nvrtc.py"),
    ]),
    ("swish", [("swish NVRTC", "swish_nvrtc.py")]),
]
WARMUP = 3


# ---------------------------------------------------------------------------------------------
# (a) the bare process


def _bare(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in a fresh interpreter: times eager and the candidates of one problem with the Timer."""
    import torch

    from kb_mcp.harness.worker.compile import Builders
    from kb_mcp.harness.worker.integrity_runtime import TrustedSnapshot
    from kb_mcp.harness.worker.loading import load_module
    from kb_mcp.harness.worker.profiling import measure_device_time
    from kb_mcp.harness.worker.timing import L2Flusher, Timer, guards_active

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    work = Path(tempfile.mkdtemp(prefix="kbmcp-bare-"))
    # The builds the pool published (a miss is built here, for this process only).
    Builders(Path(spec["cache"]), f"sm_{props.major}{props.minor}", local_dir=work / "ext").install()
    problem = load_module((PROBLEMS / f"{spec['problem']}.py").read_text(), "bare_problem", work)
    torch.manual_seed(0)
    init = [x.cuda() if isinstance(x, torch.Tensor) else x for x in problem.get_init_inputs()]
    ref = problem.Model(*init).cuda().eval()
    timer = Timer(TrustedSnapshot.capture().trusted, L2Flusher(int(props.L2_cache_size)))

    def make(i: int) -> list[Any]:
        torch.manual_seed(1000 + i)
        with torch.device("cuda"):
            return list(problem.get_inputs())

    def series(fn: Any, runs: int, make_args: Any = make) -> dict[str, float]:
        stats = timer.series(fn, make_args, runs, WARMUP)
        return {"median_ms": stats.median_ms, "min_ms": stats.min_ms, "runs": len(stats.gpu_ms)}

    out: dict[str, Any] = {"guards": guards_active(), "pid": os.getpid()}
    with torch.no_grad():
        out["eager"] = series(ref, spec["runs"]["eager"])
        models: dict[str, Any] = {"eager": ref}
        modules: dict[str, Any] = {}
        for label, file in spec["candidates"]:
            mod = load_module((CANDIDATES / file).read_text(), f"bare_{len(modules)}", work)
            modules[label] = mod
            model = mod.ModelNew(*init).cuda().eval()
            models[label] = model
            out[label] = series(model, spec["runs"][label])
        out["eager again"] = series(ref, spec["runs"]["eager"])
        inline = modules.get("chain load_inline")
        if inline is not None:
            out["breakdown"] = _breakdown(inline, init, make, series)
        # Last: the profiler's sessions would slow every event-timed launch after them.
        out["device"] = {}
        for label, fn in models.items():
            out["device"][label] = measure_device_time(functools.partial(fn, *make(0)), timer.flush).model_dump()
    return out


def _breakdown(mod: Any, init: list[Any], make: Any, series: Any) -> dict[str, dict[str, float]]:
    """Where a one-kernel load_inline call's time goes, piece by piece, in this bare process."""
    import torch

    ext = mod._ext
    model = mod.ModelNew(*init).cuda().eval()
    stream = torch.cuda.current_stream().cuda_stream
    runs = 100
    return {
        "timer floor (events around nothing)": series(lambda *a: None, runs),
        "torch.empty_like(x)": series(lambda x, y: torch.empty_like(x), runs),
        "one torch kernel (x + 1.0)": series(lambda x, y: x + 1.0, runs),
        "current stream lookup": series(lambda x, y: torch.cuda.current_stream(x.device).cuda_stream, runs),
        "pybind call, stream given": series(lambda x, y: ext.chain(x, y, stream), runs),
        "ModelNew call (the candidate)": series(model, runs),
    }


# ---------------------------------------------------------------------------------------------
# (b) the worker, and the comparison


def _sandbox(mode: str) -> Any:
    from kb_mcp.harness.sandbox.sandbox import Sandbox, detect

    return detect() if mode == "on" else Sandbox("unconfined", reason="benchmark: sandbox off")


def _through_pool(cache: Path, mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from kb_mcp.harness.judgment.verdict import VerifyOptions
    from kb_mcp.harness.pool.pool import WorkerPool
    from kb_mcp.harness.problem import load_problem

    opts = VerifyOptions(compile_baseline=False)
    results: dict[str, Any] = {}
    shutil.rmtree(cache / "baselines", ignore_errors=True)  # each mode measures eager afresh
    with WorkerPool(cache, sandbox=_sandbox(mode)) as pool:
        info = pool.info().model_dump()
        for problem_name, candidates in CASES:
            problem = load_problem(PROBLEMS / f"{problem_name}.py")
            for label, file in candidates:
                phases: list[tuple[str, float]] = []
                t0 = time.perf_counter()
                def mark(done: float, total: float | None = None, message: str | None = None,
                         marks: list[tuple[str, float]] = phases) -> None:
                    marks.append((str(message), time.perf_counter()))

                res = pool.verify(problem, (CANDIDATES / file).read_text(), opts, progress=mark)
                wall = time.perf_counter() - t0
                steps = [(m, round(b - a, 3)) for (m, a), (_, b) in zip(phases, phases[1:] + [("end", t0 + wall)])]
                t = res.timings
                print(f"  worker (sandbox {mode}): {label}: {res.summary[:160]} ({wall:.2f} s)", flush=True)
                results[label] = {
                    "problem": problem_name, "verdict": res.verdict.value, "summary": res.summary[:200],
                    "findings": [f.code.value for f in res.findings], "wall_s": round(wall, 3), "phases": steps,
                    "candidate_ms": t.candidate_ms if t else None, "eager_ms": t.eager_ms if t else None,
                    "runs": t.runs if t else None, "speedup_vs_eager": t.speedup_vs_eager if t else None,
                    "candidate_device_ms": t.candidate_device_ms if t else None,
                    "eager_device_ms": t.eager_device_ms if t else None,
                }
        state = {role: reply.model_dump() for role, reply in pool.state().items()}
    return results, {"info": info, "state": state}


def _run_bare(problem: str, candidates: list[tuple[str, str]], runs: dict[str, int], cache: Path) -> dict[str, Any]:
    spec = {"problem": problem, "candidates": candidates, "runs": runs, "cache": str(cache)}
    proc = subprocess.run([sys.executable, __file__, "--bare", json.dumps(spec)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"bare process for {problem} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:6.3f}" if a and b else "     -"


def main(argv: list[str] | None = None) -> int:
    """Runs the comparison and prints it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--cache", default=None, help="build cache to reuse (its cached baselines are removed)")
    parser.add_argument("--sandbox", choices=("on", "off", "both"), default="on",
                        help="workers sandboxed (on, the default), unconfined (off), or both side by side")
    parser.add_argument("--bare", default=None, help=argparse.SUPPRESS)  # internal: one bare process
    args = parser.parse_args(argv)
    if args.bare:
        print(json.dumps(_bare(json.loads(args.bare))))
        return 0

    tmp = None
    if args.cache:
        cache = Path(args.cache)
        shutil.rmtree(cache / "baselines", ignore_errors=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="kbmcp-fidelity-")
        cache = Path(tmp.name)
    t0 = time.perf_counter()
    modes = ["on", "off"] if args.sandbox == "both" else [args.sandbox]
    by_mode: dict[str, dict[str, Any]] = {}
    states: dict[str, dict[str, Any]] = {}
    for mode in modes:
        by_mode[mode], states[mode] = _through_pool(cache, mode)
    worker, pool_state = by_mode[modes[0]], states[modes[0]]
    bare = _bare_runs(worker, cache)
    if tmp is not None:
        tmp.cleanup()
    rows, width = _print_medians(bare, by_mode, modes, pool_state)
    device_rows = _print_device_times(bare, by_mode, modes, width)
    speedups = _print_speedups(bare, worker, width)
    _print_notes(bare, worker, pool_state)
    print(f"total {time.perf_counter() - t0:.1f} s")
    if len(modes) == 2:
        print("verdict wall time, sandbox on / off (s): " + ", ".join(
            f"{label} {by_mode['on'][label]['wall_s']:.2f}/{by_mode['off'][label]['wall_s']:.2f}" for label in worker))
    if args.out:
        Path(args.out).write_text(json.dumps({
            "device": pool_state["info"].get("device"), "pool": pool_state, "worker": worker, "by_sandbox": by_mode,
            "bare": bare, "speedups": speedups,
            "rows": [{"what": n, "bare_ms": b_ms, "worker_ms": w_ms} for n, b_ms, w_ms in rows],
            "device_rows": [{"what": n, "bare_ms": b_ms, "worker_ms": w} for n, b_ms, w in device_rows],
        }, indent=1, default=str))
    return 0


Row = tuple[str, float | None, float | None]


def _bare_runs(worker: dict[str, Any], cache: Path) -> dict[str, Any]:
    """Each case timed in a bare process, as many runs as the worker took."""
    bare: dict[str, Any] = {}
    for problem, candidates in CASES:
        # As many runs as the worker took (eager: the harness's cap, which these problems reach).
        runs = {"eager": 100, **{label: worker[label]["runs"] or 100 for label, _ in candidates}}
        bare[problem] = _run_bare(problem, candidates, runs, cache)
        print(f"  bare: {problem}: " + ", ".join(f"{k} {v['median_ms']:.4f} ms" for k, v in bare[problem].items()
                                                 if isinstance(v, dict) and "median_ms" in v), flush=True)
    return bare


def _print_medians(bare: dict[str, Any], by_mode: dict[str, dict[str, Any]], modes: list[str],
                   pool_state: dict[str, Any]) -> tuple[list[Row], int]:
    """Median times, bare process beside each sandbox mode's worker; the rows and the name column's width."""
    worker = by_mode[modes[0]]
    rows: list[Row] = []
    by_mode_rows: list[tuple[str, float | None, dict[str, float | None]]] = []
    for problem, candidates in CASES:
        b = bare[problem]
        first = candidates[0][0]
        rows.append((f"eager {problem}", b["eager"]["median_ms"], worker[first]["eager_ms"]))
        by_mode_rows.append((f"eager {problem}", b["eager"]["median_ms"],
                             {m: by_mode[m][first]["eager_ms"] for m in modes}))
        for label, _ in candidates:
            rows.append((label, b[label]["median_ms"], worker[label]["candidate_ms"]))
            by_mode_rows.append((label, b[label]["median_ms"], {m: by_mode[m][label]["candidate_ms"] for m in modes}))
    width = max(len(r[0]) for r in rows) + 2
    device = pool_state["info"].get("device")
    print(f"device: {device}  torch {pool_state['info'].get('torch_version')}")
    heads = "".join(f" {'sandbox ' + m:>12} {m + '/bare':>9}" for m in modes)
    print(f"{'median ms':<{width}} {'bare':>9}{heads}" + (f" {'on/off':>8}" if len(modes) == 2 else ""))
    for name, b_ms, w in by_mode_rows:
        cells = "".join(f" {w[m] if w[m] is not None else float('nan'):12.4f} {_ratio(w[m], b_ms):>9}" for m in modes)
        both = f" {_ratio(w['on'], w['off']):>8}" if len(modes) == 2 else ""
        print(f"{name:<{width}} {b_ms:9.4f}{cells}{both}")
    return rows, width


def _print_device_times(bare: dict[str, Any], by_mode: dict[str, dict[str, Any]], modes: list[str],
                        width: int) -> list[tuple[str, float | None, dict[str, float | None]]]:
    """Device times (summed kernel durations, profiled), bare process beside each sandbox mode's worker."""
    rows: list[tuple[str, float | None, dict[str, float | None]]] = []
    for problem, candidates in CASES:
        device = bare[problem].get("device", {})
        first = candidates[0][0]
        rows.append((f"eager {problem}", device.get("eager", {}).get("ms"),
                     {m: by_mode[m][first]["eager_device_ms"] for m in modes}))
        for label, _ in candidates:
            rows.append((label, device.get(label, {}).get("ms"),
                         {m: by_mode[m][label]["candidate_device_ms"] for m in modes}))
    heads = "".join(f" {'sandbox ' + m:>12} {m + '/bare':>9}" for m in modes)
    print(f"\n{'device time, ms':<{width}} {'bare':>9}{heads}")
    nan = float("nan")
    for name, b_ms, w in rows:
        cells = "".join(f" {w[m] if w[m] is not None else nan:12.4f} {_ratio(w[m], b_ms):>9}" for m in modes)
        print(f"{name:<{width}} {b_ms if b_ms is not None else nan:9.4f}{cells}")
    notes = {d.get("note") for p, _ in CASES for d in bare[p].get("device", {}).values() if d.get("note")}
    if notes:
        print("  bare device time notes: " + "; ".join(sorted(notes)))
    return rows


def _print_speedups(bare: dict[str, Any], worker: dict[str, Any], width: int) -> dict[str, dict[str, float | None]]:
    """Each candidate's speedup over eager, as the bare process and the worker measured it."""
    print(f"\n{'speedup over eager':<{width}} {'bare':>9} {'worker':>9} {'worker/bare':>12}")
    speedups: dict[str, dict[str, float | None]] = {}
    for problem, candidates in CASES:
        b = bare[problem]
        for label, _ in candidates:
            sb = b["eager"]["median_ms"] / b[label]["median_ms"]
            sw = worker[label]["speedup_vs_eager"]
            speedups[label] = {"bare": sb, "worker": sw}
            print(f"{label:<{width}} {sb:9.2f} {sw if sw is not None else float('nan'):9.2f} {_ratio(sw, sb):>12}")
    return speedups


def _print_notes(bare: dict[str, Any], worker: dict[str, Any], pool_state: dict[str, Any]) -> None:
    """Eager drift, where a call's time goes, the verdicts, profiler sessions and each verdict's phases."""
    print("\neager drift in the bare process (first, last):",
          ", ".join(f"{p} {bare[p]['eager']['median_ms']:.4f}/{bare[p]['eager again']['median_ms']:.4f} ms" for p,
                    _ in CASES))
    breakdown = bare["elementwise_chain_small"].get("breakdown", {})
    if breakdown:
        print("\nwhere a one-kernel load_inline call's time goes (bare process, median of 100, event time):")
        for name, st in breakdown.items():
            print(f"  {name:<40} {st['median_ms'] * 1e3:8.1f} us")
    print("\nverdicts:", "; ".join(f"{k}: {v['verdict']} {v['findings'] or ''}" for k, v in worker.items()))
    print("profiler sessions: verify worker", pool_state["state"]["verify"].get("profiler_sessions"),
          "| census worker", pool_state["state"].get("census", {}).get("profiler_sessions"))
    print("verdict wall time and phases (s):")
    for label, v in worker.items():
        print(f"  {label}: {v['wall_s']:.2f}  " + ", ".join(f"{m.split(' (')[0]} {s}" for m, s in v["phases"]))


if __name__ == "__main__":
    sys.exit(main())
