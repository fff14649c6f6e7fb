"""Eager PyTorch time of every example problem on the GPU (are they in the 0.1-10 ms range?).

    python bench/example_problems_bench.py [--runs 30]

CUDA events around each forward, L2 flushed before each run (a 2x-L2-sized buffer is rewritten),
median of the runs after 3 warm-ups; the same inputs each run (this measures the reference, not a
candidate). Prints one line per problem; figures go to docs/benchmarks.md / docs/gpu-runs.md.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def time_problem(path: Path, runs: int) -> tuple[float, float]:
    ns: dict = {"__name__": f"problem_{path.stem}"}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]()).cuda().eval()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device="cuda")
    times = []
    with torch.no_grad():
        for i in range(runs + 3):
            flush.fill_(i & 0xFF)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(*inputs)
            end.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end))
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # as in the harness: float32 means float32
    torch.backends.cudnn.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'problem':28s} {'eager median ms':>16s} {'min ms':>8s}")
    for path in sorted((ROOT / "examples" / "problems").glob("*.py")):
        median, low = time_problem(path, args.runs)
        print(f"{path.stem:28s} {median:16.4f} {low:8.4f}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
