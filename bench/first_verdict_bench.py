"""First verdicts of the largest level-1 problems, with the checks on the device and on the host.

For each problem (by default the `--top` largest of a KernelBench folder's level 1 by bytes per
forward: one input set plus one output, sized on the meta device in one sandboxed process, nothing
allocated), one verification on a cold cache (a fresh worker pool and baseline cache per problem,
so the reference's baselines are timed as in a problem's first verdict) with an honest candidate:
our own solution from `bench/kernelbench_solutions/level1` where there is one (own mode), else the
reference's forward with one kernel of its own (composed mode: the reference's own ops may stay, one
kernel of its own must run; the harness judges whether that holds). Printed per problem: the total,
where the checks ran (`MemoryPlan.pristine`) and the phases (`VerifyResult.phases_s`); with
`--compare-host` the same verification with the checks on the host beside it.

    python3 bench/first_verdict_bench.py --kernelbench /path/to/KernelBench --compare-host --out "$OUT/first.json"
    python3 bench/first_verdict_bench.py --kernelbench /path/to/KernelBench --baselines-apart   # their steps too
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import load_problem
from kb_mcp.harness.sandbox.sandbox import Grant, detect, finish

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "bench" / "kernelbench_solutions" / "level1"
PHASES = ("import", "reference_baselines", "construct", "check", "census", "probes", "timing", "baselines")

# Run in the sandbox: each problem file of the scratch folder sized on the meta device.
SIZER = r"""
import importlib.util, json, sys
from pathlib import Path
from kb_mcp.harness.worker.footprint import measure
out = {}
for path in sorted(Path(sys.argv[1]).glob("*.py")):
    try:
        spec = importlib.util.spec_from_file_location("p_" + str(abs(hash(path.stem))), path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fp = measure(mod)
        out[path.stem] = {"bytes": fp.input_bytes + fp.output_bytes, "method": fp.method}
    except Exception as exc:
        out[path.stem] = {"bytes": 0, "method": "failed: " + type(exc).__name__}
print("SIZES " + json.dumps(out))
"""

# The reference's forward with one kernel of its own (composed mode), for problems without a solution.
COMPOSED = '''
import torch
import torch.nn as nn

{reference}

KERNEL = r"""
extern "C" __global__ void touch(float* y, int n) {{
    if (blockIdx.x == 0 && threadIdx.x == 0 && n > 0) y[0] = y[0] + 0.0f;
}}
"""


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _Reference(*args, **kwargs)
        self.kernel = None  # compiled by the first forward, which the warm-up absorbs

    def forward(self, *xs):
        y = self.inner(*xs)
        if self.kernel is None:
            self.kernel = torch.cuda._compile_kernel(KERNEL, "touch")
        scratch = torch.zeros(1, device=y.device)
        self.kernel(grid=(1, 1, 1), block=(32, 1, 1), args=[scratch, 1])
        return y
'''


def sizes(level1: Path) -> dict[str, dict[str, Any]]:
    """Bytes per forward of every problem of `level1`, sized in the sandbox on the meta device."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        problems = scratch / "problems"
        problems.mkdir()
        for f in level1.glob("*.py"):
            (problems / f.name).write_text(f.read_text())
        proc = detect().popen([sys.executable, "-c", SIZER, str(problems)], Grant(role="tool", scratch=scratch),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        rc, out = finish(proc, 600)
    line = next((ln for ln in out.splitlines() if ln.startswith("SIZES ")), None)
    if line is None:
        raise SystemExit(f"sizing the problems failed (rc {rc}): {out[-2000:]}")
    return json.loads(line[len("SIZES "):])


def candidate(problem: Path) -> tuple[str, str]:
    """(source, mode): our solution where there is one, else the composed wrapper of the reference.
    The reference's class is renamed wherever its code names it (its own `super(Model, self)` too): a
    candidate that names `Model` falls back on the reference, which the static checks refuse."""
    own = SOLUTIONS / problem.name
    if own.exists():
        return own.read_text(), "own"
    return COMPOSED.format(reference=re.sub(r"\bModel\b", "_Reference", problem.read_text())), "composed"


def one(pool: WorkerPool, cache: Path, problem: Path, checks_on: str, mode: str, source: str,
        apart: bool = False) -> dict[str, Any]:
    """One first verdict on a running pool with an empty baseline cache, as a server's first
    verification of a problem it has not seen (the pool's own start is timed apart, in `main`). With
    `apart`, the reference's baselines are timed by a call of their own just before (the same work the
    verification would do first), so that their own steps (`baseline_phases_s`) come out too."""
    for stale in [*(cache / "baselines").glob("*"), *(cache / "reference_ops").glob("*")]:
        stale.unlink()  # the same problem verified before (--compare-host) starts cold too; builds stay
    opts = VerifyOptions(checks_on=checks_on, mode=mode)
    loaded = load_problem(str(problem))
    t0 = time.monotonic()
    before = pool.baselines(loaded, opts) if apart else None
    result = pool.verify(loaded, source, opts)
    total = time.monotonic() - t0
    extra = {"baseline_phases_s": before.phases, "baseline_status": before.status} if before else {}
    plan = result.memory.plan if result.memory is not None else None
    return {"checks_on": checks_on, "ran_on": plan.pristine if plan else None, "note": plan.note if plan else "",
            "verdict": result.verdict.value, "total_s": round(total, 2), "phases_s": result.phases_s,
            "summary": result.summary[:240], "sets_passed": sum(s.passed for s in result.input_sets),
            "sets": len(result.input_sets), **extra}


def line(stem: str, row: dict[str, Any]) -> str:
    """One printed line: the problem, the path, the verdict, the total and the phases."""
    phases = row["phases_s"]
    parts = " ".join(f"{p}={phases[p]:.1f}" for p in PHASES if p in phases)
    apart = row.get("baseline_phases_s")
    if apart:  # timed by their own call before the verification: their steps, then the verification's
        parts = "baselines[" + " ".join(f"{k}={v:.1f}" for k, v in apart.items()) + "] " + parts
    return (f"{stem:<40} {row['checks_on']:>6}->{row['ran_on']!s:<6} {row['verdict']:<10} "
            f"total {row['total_s']:7.1f}s  {parts}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", type=Path, required=True, help="a KernelBench folder (with level1/)")
    ap.add_argument("--problems", nargs="*", help="problem stems of level 1 (default: the --top largest)")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--compare-host", action="store_true", help="also verify with the checks on the host")
    ap.add_argument("--out", type=Path, help="a JSON file for the rows")
    ap.add_argument("--baselines-apart", action="store_true",
                    help="time the reference's baselines by a call of their own just before each verification, "
                    "to print their steps (construct, eager, compile, compile_timed)")
    args = ap.parse_args(argv)
    level1 = args.kernelbench / "level1"
    if not level1.is_dir():
        level1 = args.kernelbench / "KernelBench" / "level1"
    if args.problems:
        stems = args.problems
    else:
        sized = sizes(level1)
        stems = sorted(sized, key=lambda s: -sized[s]["bytes"])[:args.top]
        for s in stems:
            print(f"{s:<40} {sized[s]['bytes'] / (1 << 30):6.2f} GiB per forward ({sized[s]['method']})")
    problems = []
    for stem in stems:
        problem = next(level1.glob(f"{stem}*.py"), None)
        if problem is None:
            raise SystemExit(f"{stem}: no such problem in {level1}")
        problems.append(problem)
    with tempfile.TemporaryDirectory() as tmp, WorkerPool(Path(tmp)) as pool:
        start = time.monotonic()
        pool.state()  # every worker up, as in a running server
        print(f"pool started in {time.monotonic() - start:.1f} s (not counted in the verdicts below)", flush=True)
        run(pool, Path(tmp), problems, args)
    return 0


def run(pool: WorkerPool, cache: Path, problems: list[Path], args: argparse.Namespace) -> None:
    """Each problem's first verdict (and with --compare-host the same with the checks on the host)."""
    rows: list[dict[str, Any]] = []
    for problem in problems:
        source, mode = candidate(problem)
        for checks_on in ("auto", "host") if args.compare_host else ("auto",):
            row = {"problem": problem.stem, "mode": mode,
                   **one(pool, cache, problem, checks_on, mode, source, args.baselines_apart)}
            rows.append(row)
            print(line(problem.stem, row), flush=True)
            if row["sets_passed"] != row["sets"]:
                print(f"    {row['summary']}")
            if args.out:  # after each row, so a run stopped by its limit keeps what it measured
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
