"""Benchmark of the harness's verdict latency on a GPU (run it on a CUDA machine):

    python bench/harness_bench.py [--out results.json] [--repeats 3]

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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

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

    def append(self, row: tuple[str, float, str]) -> None:  # type: ignore[override]
        super().append(row)
        print(f"  [{row[1]:8.2f} s] {row[0]}: {row[2]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from kb_mcp.harness.problem import load_problem
    from kb_mcp.harness.worker import WorkerPool

    swish = load_problem(ROOT / "examples/problems/swish.py")
    swish_src = (ROOT / "examples/candidates/swish_nvrtc.py").read_text()
    row_sum = load_problem(ROOT / "examples/problems/row_sum.py")
    light_src = (ROOT / "examples/candidates/row_sum_load_inline.py").read_text()

    figures: dict[str, object] = {}
    rows = _Rows()
    with tempfile.TemporaryDirectory(prefix="kbmcp-bench-") as cache:
        pool = WorkerPool(cache)
        t0 = time.perf_counter()
        info = pool.info()
        rows.append(("worker start (torch, CUDA)", time.perf_counter() - t0, ""))
        figures["device"] = info.get("device")
        figures["torch"] = info.get("torch_version")

        t0 = time.perf_counter()
        first = pool.verify(swish, _tag(swish_src, "first"))
        rows.append(("NVRTC, first verdict of the problem (measures baselines)", time.perf_counter() - t0,
                     f"{first.verdict.value}, baseline cached={first.timings.baseline_cached if first.timings else None}"))
        warm = []
        last = first
        phases: list[list[tuple[str, float]]] = []
        for i in range(args.repeats):
            marks: list[tuple[str, float]] = []
            t0 = time.perf_counter()
            last = pool.verify(swish, _tag(swish_src, f"warm{i}"),
                               progress=lambda d, t=None, m=None, _marks=marks: _marks.append((str(m), time.perf_counter())))
            end = time.perf_counter()
            warm.append(end - t0)
            phases.append([(m.split(" (")[0], round(b - a, 3)) for (m, a), (_, b) in zip(marks, marks[1:] + [("", end)])])
        rows.append(("NVRTC, warm worker, baselines cached (median)", statistics.median(warm),
                     f"{last.verdict.value}, build {last.compile.seconds:.3f} s, speedup {last.timings.speedup_vs_baseline if last.timings else None}"))
        rows.append(("  phases of the last one", warm[-1], ", ".join(f"{m} {t}" for m, t in phases[-1] if m)))
        figures["nvrtc_warm_s"] = warm
        figures["nvrtc_warm_phases"] = phases
        figures["nvrtc_result"] = last.model_dump(mode="json", include={"verdict", "timings", "compile"})

        for label, problem, src in (("light headers", row_sum, light_src), ("torch API in .cu", row_sum, TORCH_API_INLINE)):
            t0 = time.perf_counter()
            cold = pool.verify(problem, _tag(src, "cold"))
            wall = time.perf_counter() - t0
            rows.append((f"load_inline cold, {label}: full verdict", wall,
                         f"{cold.verdict.value}, build {cold.compile.seconds:.1f} s ({cold.summary[:80]})"))
            t0 = time.perf_counter()
            hot = pool.verify(problem, _tag(src, "cached"))
            wall2 = time.perf_counter() - t0
            rows.append((f"load_inline cached, {label}: full verdict", wall2,
                         f"{hot.verdict.value}, build {hot.compile.seconds:.3f} s, cached={hot.compile.cached}"))
            figures[f"inline_{label}"] = {"cold_wall_s": wall, "cold_build_s": cold.compile.seconds,
                                          "cached_wall_s": wall2, "cached_build_s": hot.compile.seconds,
                                          "verdicts": [cold.verdict.value, hot.verdict.value]}
        pool.close()

    width = max(len(r[0]) for r in rows)
    print(f"{'measurement':<{width}}  {'seconds':>8}  notes")
    for name, secs, note in rows:
        print(f"{name:<{width}}  {secs:8.2f}  {note}")
    figures["rows"] = [{"what": n, "seconds": round(s, 3), "notes": note} for n, s, note in rows]
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
