"""KernelBench problems and their solutions through the harness on a GPU: the eval's numbers side by side.

    source .whl/prelude.sh && python3 bench/kernelbench_bench.py ../shared/kernelbench \\
        --solutions SOLUTIONS_DIR [--level 1] [--problems 1-20,40] [--kb KB] [--out "$OUT"]

Runs `kb-mcp eval`'s own code path (`campaign.evaluate.evaluate`: every solution through
`compile_and_verify`, every verdict stored in the KB), then prints, per problem, the eager and
torch.compile baselines, the solution's time and its speedups over each and over the better of the
two, all measured by the harness in this one run, plus the geomean and fast_p. Without --kb the
verdicts go to a fresh KB under --out. The report (report.md/json, plots) and bench.json land in
--out. Figures go to docs/benchmarks.md with the device and date printed here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", help="a KernelBench checkout (or level folder, or folder of problems)")
    parser.add_argument("--solutions", required=True, help="folder of solution files, matched to problems by name")
    parser.add_argument("--level", type=int)
    parser.add_argument("--problems", dest="ids", help="problem ids and ranges, e.g. 1-20,40")
    parser.add_argument("--kb", help="KB file that keeps the verdicts (default: a fresh one under --out)")
    parser.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = parser.parse_args()

    from kb_mcp.campaign.evaluate import EvalOptions, evaluate
    from kb_mcp.server.gpu import detect_gpus
    from kb_mcp.tools.context import ToolContext

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    gpus = detect_gpus()
    if not gpus:
        print("kernelbench_bench: no GPU found; this benchmark times kernels and needs one", file=sys.stderr)
        return 2
    print(f"device: {gpus[0]}  date: {time.strftime('%Y-%m-%d %H:%MZ', time.gmtime())}", flush=True)
    ctx = ToolContext(Path(args.kb) if args.kb else out / "kb.json", client_name="kernelbench_bench")
    started = time.perf_counter()
    try:
        result = evaluate(out / "eval", ctx, EvalOptions(problems=[args.problems], solutions=args.solutions,
                                                         level=args.level, ids=args.ids),
                          have_gpu=True, log=lambda line: print(line, flush=True))
    finally:
        ctx.close()
    wall = time.perf_counter() - started
    report = result.report
    verdicts = {line.problem: line for line in result.lines}
    print(f"\n{'problem':44s} {'verdict':>13s} {'eager ms':>9s} {'compile ms':>10s} {'ours ms':>9s} "
          f"{'/eager':>7s} {'/compile':>8s} {'/better':>8s}")
    for r in report.problems:
        line = verdicts.get(r.problem)
        verdict = line.verdict.value if line and line.verdict else "-"
        print(f"{r.problem[:44]:44s} {verdict:>13s} {_f(r.eager_ms, 9)} {_f(r.compile_ms, 10)} {_f(r.best_ms, 9)} "
              f"{_f(r.best_vs_eager, 7, 'x')} {_f(r.best_vs_compile, 8, 'x')} {_f(r.best_speedup, 8, 'x')}")
    s = report.speedup
    print(f"\nvalid {report.valid_rate:.0%} of {len(report.problems)}; geomean over the better baseline "
          f"{_f(s.geomean, 0, 'x').strip()} (n={s.n}), over eager "
          f"{_f(report.speedup_vs_eager.geomean, 0, 'x').strip()}, "
          f"over torch.compile {_f(report.speedup_vs_compile.geomean, 0, 'x').strip()}; "
          f"fast_1 {report.fast_p.get('1', 0):.0%}, fast_2 {report.fast_p.get('2', 0):.0%}; wall {wall:.0f} s")
    (out / "bench.json").write_text(json.dumps({"device": gpus[0], "wall_s": wall,
                                                "lines": [line.model_dump(mode="json") for line in result.lines],
                                                "report": report.model_dump(mode="json")}, indent=1, default=str))
    print(f"report: {result.report_md}\nbench.json: {out / 'bench.json'}")
    return 0


def _f(value: float | None, width: int, suffix: str = "") -> str:
    return f"{'-':>{width}s}" if value is None else f"{value:{width - len(suffix)}.3f}{suffix}"


if __name__ == "__main__":
    sys.exit(main())
