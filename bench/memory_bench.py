"""GPU memory of verifications at KernelBench's real sizes, beside the bound the harness states.

For each problem and solution given (by default the largest level-1 problems we have solutions for),
one verification through the worker pool, and a table of what it took: the problem's footprint
(one input set, one output), eager's measured peak, the plan (pristine copies on the device or the
host), the most the verify and census workers' allocators reserved, the device's memory in use above
its idle level at its highest (NVML, every process together) and `harness.gpu.memory.bound` (eager's peak
plus two of the larger of an input set and an output plus the fixed overhead), with their ratio.

    source .whl/prelude.sh && python3 bench/memory_bench.py --kernelbench .kernelbench --out "$OUT/memory.json"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kb_mcp.harness.gpu.memory import GIB, bound
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import load_problem

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "bench" / "kernelbench_solutions"
# (level, problem stem): the largest problems (inputs plus output of one forward) with a solution of ours
DEFAULT = [(1, "45_Average_Pooling_2D"), (1, "39_L2Norm_"), (1, "38_L1Norm_"), (1, "31_ELU"),
           (1, "88_MinGPTNewGelu")]


def one(pool: WorkerPool, problem_path: Path, solution: Path) -> dict[str, object]:
    """One verification and the figures of its memory report."""
    problem = load_problem(str(problem_path))
    t0 = time.monotonic()
    result = pool.verify(problem, solution.read_text())
    row: dict[str, object] = {"problem": problem_path.stem, "verdict": result.verdict.value,
                              "summary": result.summary[:300], "elapsed_s": round(time.monotonic() - t0, 1)}
    memory = result.memory
    if memory is None:
        return row
    fp = memory.footprint
    taken = (memory.device_peak_bytes - memory.device_idle_bytes
             if memory.device_peak_bytes is not None and memory.device_idle_bytes is not None else None)
    limit = bound(fp, memory.plan.pristine)
    row.update(input_gib=fp.input_bytes / GIB, output_gib=fp.output_bytes / GIB,
               eager_peak_gib=(fp.eager_peak_bytes or 0) / GIB, pristine=memory.plan.pristine,
               verify_peak_gib=(memory.verify_peak_bytes or 0) / GIB,
               census_peak_gib=(memory.census_peak_bytes or 0) / GIB,
               device_taken_gib=None if taken is None else taken / GIB, bound_gib=limit / GIB,
               within_bound=None if taken is None else taken <= limit,
               device_idle_gib=None if memory.device_idle_bytes is None else memory.device_idle_bytes / GIB)
    return row


def _line(r: dict[str, object]) -> str:
    def num(key: str) -> str:
        value = r.get(key)
        return f"{value:.2f}" if isinstance(value, float) else "-"

    taken, limit = r.get("device_taken_gib"), r.get("bound_gib")
    ratio = f"{taken / limit:.2f}" if isinstance(taken, float) and isinstance(limit, float) else "-"
    return (f"{str(r['problem'])[:26]:<26} {num('input_gib'):>6} {num('output_gib'):>6} {num('eager_peak_gib'):>6} "
            f"{r.get('pristine', '-')!s:>6} {num('verify_peak_gib'):>7} {num('census_peak_gib'):>7} "
            f"{num('device_taken_gib'):>7} {num('bound_gib'):>6} {ratio:>6}  {r['verdict']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernelbench", required=True, help="a KernelBench checkout (its level folders)")
    parser.add_argument("--problems", nargs="*", help="LEVEL/STEM items (default: the largest we have solutions for)")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    items = [(int(p.split("/")[0]), p.split("/")[1]) for p in args.problems] if args.problems else DEFAULT
    rows = []
    with WorkerPool() as pool:
        for level, stem in items:
            problem = Path(args.kernelbench) / f"level{level}" / f"{stem}.py"
            solution = SOLUTIONS / f"level{level}" / f"{stem}.py"
            row = one(pool, problem, solution)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'problem':<26} {'in':>6} {'out':>6} {'eager':>6} {'host?':>6} {'verify':>7} {'census':>7} "
          f"{'device':>7} {'bound':>6} {'ratio':>6}  verdict")
    for r in rows:
        print(_line(r))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0 if all(r.get("within_bound") is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
