"""The pipelined eval beside the serial one: how much of the solutions' cold builds hides behind the
GPU's verifications.

    source .whl/prelude.sh && python3 bench/eval_pipeline_bench.py ../shared/kernelbench --out "$OUT" \\
        [--solutions bench/eval_pipeline_solutions] [--level 2] [--problems 9,12,29] [--build-jobs N] \\
        [--serial-first] [--compile-only]

In one process, the same problems and solutions go through `kb-mcp eval` (`campaign.evaluate`) twice:
pipelined (the next solutions built ahead on the CPU cores while one verifies), then serially
(`build_jobs=0`: each verification builds its own extension while the GPU waits); the pipelined run
goes first, so that it is the one whose compilers read their headers cold, and so that its numbers
are written (eval_pipeline.json, after each run) even if the serial run is cut short. Each run has a KB, a
cache (build cache, compile-only cache, baselines) and an eval folder of its own, so both start cold;
each starts its worker pool (and probes the compilers) before its clock starts, so neither wall time
holds start-up, which is the same for both. It prints, per problem, both verdicts and where the time
went, and then:

* the wall time of each eval;
* the GPU time of the verifications: each compile_and_verify call (the GPU lane held) less the time
  its worker spent building or waiting for builds (`StepTimes.verify_s`), summed; this is the time the
  GPU was verifying, which no pipelining can shorten;
* pipelined wall / GPU time (target: at most 1.3; with the serial run's GPU time too, the stricter of
  the two when builds beside a verification slow it);
* whether the verdicts agree (faster and slower as one: a timing near 1.0x may fall either side; the
  exit code is 1 when they do not).

Without a GPU (`--compile-only`, or none here) the verifications are the compile-only path's and hold
no GPU time: the ratio is printed but means nothing; the run shows the pipeline working and the verdicts
agreeing. The solutions in bench/eval_pipeline_solutions are ten level-2 problems' load_inline
kernels (plain GEMM or convolution with the problem's epilogue; torch/extension.h on the C++ side, so
each cold build takes real time). Writes eval_pipeline.json to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "bench" / "eval_pipeline_solutions"
TARGET = 1.3


class ModeRun(BaseModel):
    """One eval (serial or pipelined) and what it measured."""

    model_config = ConfigDict(extra="forbid")

    mode: str
    build_jobs: int
    start_s: float  # starting the worker pool and probing the compilers (before the clock)
    wall_s: float
    gpu_s: float  # the verifications' own time (StepTimes.verify_s, summed)
    build_in_verify_s: float  # time verifications spent on builds (what was not built ahead)
    wait_s: float  # time spent waiting for builds ahead, outside the verifications
    device: str = ""
    problems: list[dict[str, Any]]


def solution_ids(solutions: Path, level: int) -> str | None:
    """The ids of the problems the solutions folder has a file for (`9_Matmul....py` -> 9); None: every one."""
    folder = solutions / f"level{level}" if (solutions / f"level{level}").is_dir() else solutions
    ids = sorted({int(p.name.split("_", 1)[0]) for p in folder.glob("*.py") if p.name.split("_", 1)[0].isdigit()})
    return ",".join(map(str, ids)) or None


def _warm(ctx: Any) -> tuple[float, str]:
    """Starts the pool's workers (and the census worker on a GPU) and probes the compilers: (seconds, device)."""
    from kb_mcp.harness.builds import toolchain

    t0 = time.monotonic()
    toolchain(ctx.sandbox)
    pool = ctx.workers
    info = pool.info()
    if info.cuda:
        pool.state()  # waits until the census worker is up too
    return time.monotonic() - t0, info.device


def add_eval_set(parser: argparse.ArgumentParser) -> None:
    """The arguments naming the problems and solutions a bench evaluates (this bench's and scale_bench's)."""
    parser.add_argument("problems", nargs="+", help="a KernelBench checkout (or problem folders/files)")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help="solution files, matched by name")
    parser.add_argument("--level", type=int, default=2, help="KernelBench level (default 2)")
    parser.add_argument("--problems", dest="ids", help="problem ids (default: those the solutions folder has)")


def run_mode(mode: str, jobs: int, args: argparse.Namespace, root: Path) -> ModeRun:
    """One eval in folders of its own (cold caches), timed from its first problem to its report."""
    from kb_mcp.campaign.evaluate import EvalOptions, evaluate
    from kb_mcp.tools.context import ToolContext

    folder = root / mode
    ctx = ToolContext(folder / "kb.json", cache_dir=folder / "cache", client_name="eval pipeline bench")
    options = EvalOptions(problems=list(args.problems), solutions=str(args.solutions), level=args.level,
                          ids=args.ids, compile_only=args.compile_only, build_jobs=jobs)
    try:
        start_s, device = _warm(ctx)
        print(f"[{mode}] workers started in {start_s:.1f} s{f' on {device}' if device else ''}; evaluating",
              file=sys.stderr, flush=True)
        t0 = time.monotonic()
        result = evaluate(folder / "out", ctx, options, have_gpu=not args.compile_only,
                          progress=_progress(mode) if args.verbose else None,
                          log=lambda text: print(f"[{mode}] {text}", file=sys.stderr, flush=True))
        wall = time.monotonic() - t0
    finally:
        ctx.close()
    timed = [line.times for line in result.lines if line.times is not None]
    rows = [{"problem": line.problem, "verdict": line.verdict.value if line.verdict else None,
             "speedup": line.speedup, "note": line.note,
             **(line.times.model_dump() if line.times else {})} for line in result.lines]
    return ModeRun(mode=mode, build_jobs=jobs, start_s=round(start_s, 3), wall_s=round(wall, 3),
                   gpu_s=round(sum(t.verify_s for t in timed), 3),
                   build_in_verify_s=round(sum(t.build_s for t in timed), 3),
                   wait_s=round(sum(t.wait_s for t in timed), 3), device=device, problems=rows)


def _progress(mode: str) -> Any:
    def show(problem: str, done: int, total: int, message: str) -> None:
        print(f"[{mode}] {problem}: {message}", file=sys.stderr, flush=True)

    return show


def _kind(verdict: str | None) -> str | None:
    """faster and slower are one kind: two timings of a kernel near 1.0x may fall either side of it."""
    return "valid" if verdict in ("faster", "slower") else verdict


def disagreements(serial: ModeRun, piped: ModeRun) -> list[str]:
    """Problems whose verdict (faster and slower as one) or the harness's note on it differs between
    the two runs."""
    a = {p["problem"]: (_kind(p["verdict"]), p["note"]) for p in serial.problems}
    b = {p["problem"]: (_kind(p["verdict"]), p["note"]) for p in piped.problems}
    return [f"{name}: serial {a.get(name)} / pipelined {b.get(name)}" for name in sorted(set(a) | set(b))
            if a.get(name) != b.get(name)]


def exact_agreement(serial: ModeRun, piped: ModeRun) -> int:
    """Problems whose verdicts are the very same word in both runs."""
    b = {p["problem"]: p["verdict"] for p in piped.problems}
    return sum(1 for p in serial.problems if b.get(p["problem"]) == p["verdict"])


def table(serial: ModeRun, piped: ModeRun) -> str:
    """Per problem: both verdicts and speedups, and where each run's time went."""
    rows = [f"{'problem':<40} {'serial':<12} {'pipelined':<12} {'s verify':>9} {'s build':>8} "
            f"{'p verify':>9} {'p wait':>7} {'p build':>8} {'speedup s/p':>13}"]
    by_name = {p["problem"]: p for p in piped.problems}
    for s in serial.problems:
        p = by_name.get(s["problem"], {})

        def num(row: dict[str, Any], key: str, width: int) -> str:
            value = row.get(key)
            return f"{value:>{width}.1f}" if isinstance(value, (int, float)) else f"{'-':>{width}}"

        speed = "/".join(f"{r['speedup']:.2f}" if r.get("speedup") else "-" for r in (s, p))
        rows.append(f"{s['problem'][:40]:<40} {s['verdict']!s:<12} {p.get('verdict')!s:<12} "
                    f"{num(s, 'verify_s', 9)} {num(s, 'build_s', 8)} {num(p, 'verify_s', 9)} {num(p, 'wait_s', 7)} "
                    f"{num(p, 'build_s', 8)} {speed:>13}")
    return "\n".join(rows)


def summary(serial: ModeRun, piped: ModeRun, compile_only: bool) -> dict[str, Any]:
    """The headline numbers (ratios over the GPU time of the verifications)."""
    ratio = piped.wall_s / piped.gpu_s if piped.gpu_s else None
    strict = piped.wall_s / min(piped.gpu_s, serial.gpu_s) if piped.gpu_s and serial.gpu_s else None
    return {
        "serial_wall_s": serial.wall_s, "pipelined_wall_s": piped.wall_s,
        "gpu_s_pipelined": piped.gpu_s, "gpu_s_serial": serial.gpu_s,
        "builds_in_serial_verifications_s": serial.build_in_verify_s,
        "builds_in_pipelined_verifications_s": piped.build_in_verify_s,
        "pipelined_waits_for_builds_s": piped.wait_s,
        "ratio": round(ratio, 3) if ratio else None, "ratio_strict": round(strict, 3) if strict else None,
        "target": TARGET, "meaningful": not compile_only,
        "met": bool(strict and strict <= TARGET) if not compile_only else None,
        "speedup_over_serial": round(serial.wall_s / piped.wall_s, 3) if piped.wall_s else None,
        "verdicts_agree": not disagreements(serial, piped),
        "verdicts_the_same_word": exact_agreement(serial, piped),
    }


def report(serial: ModeRun, piped: ModeRun, compile_only: bool) -> str:
    """The text the bench prints."""
    s = summary(serial, piped, compile_only)
    lines = [table(serial, piped), "",
             f"device: {piped.device or 'none (compile-only)'}; builds ahead: {piped.build_jobs} at a time",
             f"wall: serial {serial.wall_s:.1f} s, pipelined {piped.wall_s:.1f} s "
             f"(serial / pipelined: {s['speedup_over_serial']}); worker start-up before each clock: "
             f"{serial.start_s:.1f} s / {piped.start_s:.1f} s",
             f"GPU time of the verifications (lane held, builds excluded): pipelined {piped.gpu_s:.1f} s, "
             f"serial {serial.gpu_s:.1f} s",
             f"builds inside verifications: serial {serial.build_in_verify_s:.1f} s, pipelined "
             f"{piped.build_in_verify_s:.1f} s; pipelined waits for builds ahead: {piped.wait_s:.1f} s"]
    if s["ratio"] is None:
        lines.append("pipelined wall / GPU time: - (no verification time measured)")
    else:
        verdict = ("(no GPU: not meaningful)" if compile_only else
                   f"target <= {TARGET}: {'met' if s['met'] else 'NOT met'}")
        lines.append(f"pipelined wall / GPU time: {s['ratio']:.2f} (over the smaller GPU time of the two runs: "
                     f"{s['ratio_strict']:.2f}) {verdict}")
    differ = disagreements(serial, piped)
    same = f" ({exact_agreement(serial, piped)}/{len(serial.problems)} the very same word; faster and slower " \
           "count as one, a timing near 1.0x may fall either side)"
    lines.append("verdicts agree: yes" + same if not differ else "verdicts agree: NO\n  " + "\n  ".join(differ))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_eval_set(parser)
    parser.add_argument("--build-jobs", type=int, default=None, help="builds ahead at once (default: the eval's)")
    parser.add_argument("--serial-first", action="store_true", help="run the serial eval first")
    parser.add_argument("--compile-only", action="store_true", help="no GPU: compile-only verifications")
    parser.add_argument("--out", type=Path, help="folder for eval_pipeline.json (and the runs' folders)")
    parser.add_argument("--verbose", action="store_true", help="print every progress update")
    args = parser.parse_args(argv)
    from kb_mcp.harness.ahead import default_jobs

    args.ids = args.ids or solution_ids(args.solutions, args.level)
    jobs = default_jobs() if args.build_jobs is None else args.build_jobs
    if jobs < 1:
        parser.error("--build-jobs must be at least 1 for the pipelined run")
    root = (args.out or Path(tempfile.mkdtemp(prefix="eval-pipeline-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    order = [("serial", 0), ("pipelined", jobs)] if args.serial_first else [("pipelined", jobs), ("serial", 0)]
    runs: dict[str, ModeRun] = {}
    out: dict[str, Any] = {"order": [m for m, _ in order], "summary": None, "runs": {}}
    for mode, n in order:
        runs[mode] = run_mode(mode, n, args, root)
        out["runs"][mode] = runs[mode].model_dump()
        (root / "eval_pipeline.json").write_text(json.dumps(out, indent=1))  # what was measured so far
        print(f"[{mode}] wall {runs[mode].wall_s:.1f} s, GPU time of the verifications {runs[mode].gpu_s:.1f} s",
              file=sys.stderr, flush=True)
    serial, piped = runs["serial"], runs["pipelined"]
    print(report(serial, piped, args.compile_only))
    out["summary"] = headline = summary(serial, piped, args.compile_only)
    (root / "eval_pipeline.json").write_text(json.dumps(out, indent=1))
    print(f"written: {root / 'eval_pipeline.json'}")
    return 0 if headline["verdicts_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
