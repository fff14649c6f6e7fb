"""Benchmark of the harness's verdict latency on a GPU (run it on a CUDA machine):

    python bench/harness_bench.py [--out results.json] [--repeats 3] [--sandbox on|off|both] [--no-inline]

Measures, each as full `WorkerPool.verify` wall time (build, all input sets, checks, the kernel
census in the census worker, timing):
  * worker start (torch + CUDA init) until it answers (the census worker, which also warms up the
    profiler, starts beside it);
  * NVRTC candidate with a warm worker and the problem's baselines cached (target <= 2 s), after a
    first verdict that measured the baselines (eager + torch.compile) and cached them, with the
    time of each phase;
  * load_inline candidate built cold (fresh build cache), light headers (no torch header in the .cu);
  * load_inline candidate built cold whose .cu uses torch's C++ API (needs torch/types.h);
  * the same load_inline candidate again: build from the cache (target <= 1 s for the build).
Each new verdict uses a candidate source with a unique comment, so only builds and baselines are
reused, never a verdict. Prints a table and writes JSON. In-worker against bare-process timing is
`bench/timing_fidelity.py`.

`--sandbox both` measures everything with the workers in the sandbox (`on`, the default) and
unconfined (`off`, as `KB_MCP_SANDBOX=unconfined` runs them), one pool and cache per mode, the
warm verdicts alternating between the two, and prints the ratio on/off per measurement: what the
sandbox costs a verdict.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

TORCH_API_INLINE = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA = r"""
__global__ void row_sum_kernel(const float* x, float* out, int cols) {
    const float* row = x + (size_t)blockIdx.x * cols;
    float acc = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) acc += row[c];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, o);
    __shared__ float part[32];
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        acc = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, o);
        if (threadIdx.x == 0) out[blockIdx.x] = acc;
    }
}

torch::Tensor row_sum(torch::Tensor x) {
    auto out = torch::empty({x.size(0), 1}, x.options());
    row_sum_kernel<<<x.size(0), 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), (int)x.size(1));
    return out;
}
"""

_ext = load_inline(name="bench_row_sum_torch_api", cpp_sources="torch::Tensor row_sum(torch::Tensor x);",
                   cuda_sources=CUDA, functions=["row_sum"])


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.row_sum(x.contiguous())
'''


def _tag(source: str, label: str) -> str:
    return f"{source}\n# bench {label} {time.time_ns()}\n"


class _Rows(list):
    """The table's rows, each also printed as soon as it is measured (a run cut short keeps them)."""

    def append(self, row: tuple[str, float, str]) -> None:
        super().append(row)
        print(f"  [{row[1]:8.2f} s] {row[0]}: {row[2]}", flush=True)


def _sandbox(mode: str) -> object:
    from kb_mcp.harness.sandbox.sandbox import Sandbox, detect

    return detect() if mode == "on" else Sandbox("unconfined", reason="benchmark: sandbox off")


class _Results:
    """What the benchmark measured: the printed rows, seconds per measurement and mode, the JSON figures."""

    def __init__(self, modes: list[str]) -> None:
        self.rows = _Rows()
        self.table: dict[str, dict[str, float]] = {}  # measurement -> mode -> seconds
        self.figures: dict[str, object] = {"modes": modes}

    def record(self, name: str, mode: str, secs: float, note: str) -> None:
        self.rows.append((f"[sandbox {mode}] {name}", secs, note))
        self.table.setdefault(name, {})[mode] = secs


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sandbox", choices=("on", "off", "both"), default="on",
                        help="workers sandboxed (on, the default), unconfined (off), or both side by side")
    parser.add_argument("--no-inline", action="store_true", help="skip the load_inline builds (the slow part)")
    args = parser.parse_args(argv)

    from kb_mcp.harness.pool.pool import WorkerPool

    modes = ["on", "off"] if args.sandbox == "both" else [args.sandbox]
    out = _Results(modes)
    with tempfile.TemporaryDirectory(prefix="kbmcp-bench-") as tmp:
        pools = {}
        for mode in modes:  # one pool (own cache: own builds, own baselines) per mode
            pool = pools[mode] = WorkerPool(Path(tmp) / mode, sandbox=_sandbox(mode))  # type: ignore[arg-type]
            t0 = time.perf_counter()
            info = pool.info()
            out.record("worker start (torch, CUDA)", mode, time.perf_counter() - t0, "")
            out.figures["device"] = info.device
            out.figures["torch"] = info.torch_version
        _nvrtc(pools, modes, args.repeats, out)
        if not args.no_inline:
            _load_inline(pools, modes, out)
        for pool in pools.values():
            pool.close()
    _print(out, modes)
    if args.out:
        Path(args.out).write_text(json.dumps(out.figures, indent=1, default=str))
    return 0


def _nvrtc(pools: dict[str, Any], modes: list[str], repeats: int, out: _Results) -> None:
    """An NVRTC candidate: the first verdict of its problem, then warm verdicts, the modes alternating."""
    from kb_mcp.harness.problem import load_problem

    swish = load_problem(ROOT / "examples/problems/swish.py")
    swish_src = (ROOT / "examples/candidates/swish_nvrtc.py").read_text()
    for mode in modes:
        t0 = time.perf_counter()
        first = pools[mode].verify(swish, _tag(swish_src, "first"))
        out.record("NVRTC, first verdict of the problem (measures baselines)", mode, time.perf_counter() - t0,
                   f"{first.verdict.value}, baseline cached={first.timings.baseline_cached if first.timings else None}")
    warm: dict[str, list[float]] = {m: [] for m in modes}
    phases: dict[str, list[list[tuple[str, float]]]] = {m: [] for m in modes}
    last = {}
    for i in range(repeats):  # the modes alternate, so both see the same machine state
        for mode in modes:
            marks: list[tuple[str, float]] = []
            t0 = time.perf_counter()
            last[mode] = pools[mode].verify(
                swish, _tag(swish_src, f"warm{i}"),
                progress=lambda d, t=None, m=None, _marks=marks: _marks.append((str(m), time.perf_counter())))
            end = time.perf_counter()
            warm[mode].append(end - t0)
            phases[mode].append([(m.split(" (")[0], round(b - a, 3))
                                 for (m, a), (_, b) in zip(marks, marks[1:] + [("", end)])])
    for mode in modes:
        res = last[mode]
        out.record("NVRTC, warm worker, baselines cached (median)", mode, statistics.median(warm[mode]),
                   f"{res.verdict.value}, build {res.compile.seconds:.3f} s, speedup "
                   f"{res.timings.speedup_vs_baseline if res.timings else None}")
        out.rows.append((f"[sandbox {mode}]   phases of the last one", warm[mode][-1],
                         ", ".join(f"{m} {t}" for m, t in phases[mode][-1] if m)))
    out.figures["nvrtc_warm_s"] = warm
    out.figures["nvrtc_warm_phases"] = phases
    out.figures["nvrtc_result"] = {m: last[m].model_dump(mode="json", include={"verdict", "timings", "compile"})
                                   for m in modes}


def _load_inline(pools: dict[str, Any], modes: list[str], out: _Results) -> None:
    """load_inline candidates built cold, then found in the build cache."""
    from kb_mcp.harness.problem import load_problem

    row_sum = load_problem(ROOT / "examples/problems/row_sum.py")
    light_src = (ROOT / "examples/candidates/row_sum_load_inline.py").read_text()
    for label, problem, src in (("light headers", row_sum, light_src), ("torch API in .cu", row_sum, TORCH_API_INLINE)):
        for mode in modes:
            pool = pools[mode]
            t0 = time.perf_counter()
            cold = pool.verify(problem, _tag(src, "cold"))
            wall = time.perf_counter() - t0
            out.record(f"load_inline cold, {label}: full verdict", mode, wall,
                       f"{cold.verdict.value}, build {cold.compile.seconds:.1f} s ({cold.summary[:80]})")
            t0 = time.perf_counter()
            hot = pool.verify(problem, _tag(src, "cached"))
            wall2 = time.perf_counter() - t0
            out.record(f"load_inline cached, {label}: full verdict", mode, wall2,
                       f"{hot.verdict.value}, build {hot.compile.seconds:.3f} s, cached={hot.compile.cached}")
            out.figures[f"inline_{label}_{mode}"] = {
                "cold_wall_s": wall, "cold_build_s": cold.compile.seconds, "cached_wall_s": wall2,
                "cached_build_s": hot.compile.seconds, "verdicts": [cold.verdict.value, hot.verdict.value]}


def _print(out: _Results, modes: list[str]) -> None:
    """The table of measurements, and the sandbox's cost side by side when both modes ran."""
    rows, table = out.rows, out.table
    width = max(len(r[0]) for r in rows)
    print(f"{'measurement':<{width}}  {'seconds':>8}  notes")
    for name, secs, note in rows:
        print(f"{name:<{width}}  {secs:8.2f}  {note}")
    if len(modes) == 2:
        width = max(len(n) for n in table)
        print(f"\n{'seconds':<{width}}  {'sandbox on':>10}  {'off':>8}  {'on/off':>7}")
        for name, by in table.items():
            print(f"{name:<{width}}  {by['on']:10.3f}  {by['off']:8.3f}  {by['on'] / by['off']:7.3f}")
    out.figures["rows"] = [{"what": n, "seconds": round(s, 3), "notes": note} for n, s, note in rows]
    out.figures["by_sandbox"] = table


if __name__ == "__main__":
    sys.exit(main())
