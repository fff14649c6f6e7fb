"""The pipelined eval beside the serial one: how much of the solutions' cold builds hides behind the
GPU's work.

    source .whl/prelude.sh && python3 bench/eval_pipeline_bench.py ../shared/kernelbench --out "$OUT" \\
        [--solutions bench/eval_pipeline_solutions] [--level 2] [--problems 9,12,29] [--build-jobs N] \\
        [--only pipelined|serial|baselines] [--baselines-cache DIR [--uncached IDS]] [--serial-first] \\
        [--compile-only]
    python3 bench/eval_pipeline_bench.py --combine A/eval_pipeline.json B/eval_pipeline.json ... [--out DIR]

The same problems and solutions go through `kb-mcp eval` (`campaign.evaluate`) twice: pipelined (the
next solutions built ahead on the CPU cores while one verifies, and, while a verification waits for
its build, the GPU timing the baselines of problems not cached yet), then serially (`build_jobs=0`:
each verification builds its own extension, and times its baselines when they are not cached, while
the GPU waits). The pipelined run goes first, so that it is the one whose compilers read their headers
cold, and so that its numbers are written (eval_pipeline.json, after each run) even if the serial run
is cut short. Each run has a KB, a cache (build cache, compile-only cache, baselines) and an eval
folder of its own, so both start with cold builds; each starts its worker pool (and probes the
compilers) before its clock starts, so neither wall time holds start-up, which is the same for both.
It prints, per problem, both verdicts, where its baselines came from and where the time went, then:

* the wall time of each eval;
* the GPU time of each: the verifications' (each compile_and_verify call, the GPU lane held, less the
  time its worker spent building: `StepTimes.verify_s`) plus the baselines the eval timed ahead
  (`StepTimes.baselines_s`, the lane held too), summed; the GPU's own work, which no pipelining can
  shorten (a baseline not cached is timed either ahead or inside its verification);
* pipelined wall / GPU time (target: at most 1.3; with the serial run's GPU time too, the stricter of
  the two when builds beside a verification slow it), and over the verifications alone;
* whether the verdicts agree (faster and slower as one: a timing near 1.0x may fall either side; the
  exit code is 1 when they do not).

At KernelBench's sizes on one H200 both runs with their baselines do not fit one device call (a
problem's baselines ~15 s, a verification ~25 s, a cold build 30-60 s; serially ten problems take
~10 minutes alone). So the baselines can be timed once and handed to later calls:

* `--only baselines` times only the selected problems' baselines (`WorkerPool.baselines`, as
  `kb-mcp eval --baselines` does) and writes them to `--out`/baselines/: the harness's baseline cache
  files (`harness.baselines.BaselineCache`: one small JSON per problem hash, GPU name, torch version
  and track, named by them) and index.json (which problem each file is, and its figures);
* `--baselines-cache DIR` copies DIR's baseline files into each run's fresh cache before its clock
  starts, so the runs start with cold builds but cached baselines; it prints which problems' baselines
  came from DIR (and which were not there for this GPU, torch and track: those are timed by the run).
  `--uncached IDS` leaves those problems' out, so the pipelined run times them while its first builds
  run (as an eval of new problems does) and the serial run inside their verifications;
* `--only pipelined` or `--only serial` runs one eval (with `--problems`, a part of one);
* `--combine A.json B.json ...` reads several calls' eval_pipeline.json and prints the one report
  (runs of one mode from several calls, over disjoint problems, are added up: their walls, GPU times
  and problems; a pipelined run in parts pays a first build per part, so its ratio is the worse for it).

The recipe on one H200 (each call well under the device's ~560 s; `.kernelbench` is the checkout there):

    call 1 (~3 min): source .whl/prelude.sh && python3 bench/eval_pipeline_bench.py .kernelbench \\
        --out "$OUT" --only baselines
      then copy $OUT/baselines/ (ten small JSON files and index.json) to
      bench/results/eval-pipeline-baselines-h200/ and commit it
    call 2 (~6 min): source .whl/prelude.sh && python3 bench/eval_pipeline_bench.py .kernelbench \\
        --out "$OUT" --baselines-cache bench/results/eval-pipeline-baselines-h200 --uncached 9,12,29 \\
        --only pipelined
    call 3 (~6 min): the same with --only serial --problems 9,12,29,53,57
    call 4 (~5 min): the same with --only serial --problems 68,69,70,81,95
    then, here: python3 bench/eval_pipeline_bench.py --combine <call 2>/eval_pipeline.json \\
        <call 3>/eval_pipeline.json <call 4>/eval_pipeline.json --out bench/results/eval-pipeline-h200

The three problems left uncached are the eval's first: the pipelined run times their baselines while
its first builds run (what it does for any problem it has no baselines for); the serial calls time
them inside their verifications. Both runs' GPU time holds them, so the two compare alike. Without
`--uncached` every baseline is cached and the first build shows whole in the pipelined wall (a floor
of ~1.2 on the ratio over ten problems).

Without a GPU (`--compile-only`, or none here) the verifications are the compile-only path's and hold
no GPU time, and no baselines are timed (`--only baselines` says needs_gpu): the ratio is printed but
means nothing; the run shows the pipeline working and the verdicts agreeing. The solutions in
bench/eval_pipeline_solutions are ten level-2 problems' load_inline kernels (plain GEMM or convolution
with the problem's epilogue; torch/extension.h on the C++ side, so each cold build takes real time).
Writes eval_pipeline.json to --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "bench" / "eval_pipeline_solutions"
TARGET = 1.3
RESULT = "eval_pipeline.json"
INDEX = "index.json"  # beside the baseline files: which problem each is


class ModeRun(BaseModel):
    """One eval (serial or pipelined) and what it measured; a run in parts is their sum (`merge`)."""

    model_config = ConfigDict(extra="forbid")

    mode: str
    build_jobs: int
    start_s: float  # starting the worker pool and probing the compilers (before the clock)
    wall_s: float
    gpu_s: float  # the GPU's work: verify_gpu_s + baselines_gpu_s
    verify_gpu_s: float  # the verifications' own time (StepTimes.verify_s, summed)
    baselines_gpu_s: float = 0.0  # baselines timed ahead while verifications waited for builds (baselines_s)
    build_in_verify_s: float  # time verifications spent on builds (what was not built ahead)
    wait_s: float  # time spent waiting for builds ahead, outside the verifications
    device: str = ""
    baselines_cache: str = ""  # the folder the run's cache was seeded from
    seeded: list[str] = Field(default_factory=list)  # problems whose baselines were cached at the start
    parts: int = 1  # device calls this run was measured in
    problems: list[dict[str, Any]]


class Selected(BaseModel):
    """A problem the eval verifies (one with a solution), in the eval's order."""

    name: str
    id: int | None
    hash: str


def solution_ids(solutions: Path, level: int) -> str | None:
    """The ids of the problems the solutions folder has a file for (`9_Matmul....py` -> 9); None: every one."""
    folder = solutions / f"level{level}" if (solutions / f"level{level}").is_dir() else solutions
    ids = sorted({int(p.name.split("_", 1)[0]) for p in folder.glob("*.py") if p.name.split("_", 1)[0].isdigit()})
    return ",".join(map(str, ids)) or None


def selected(args: argparse.Namespace) -> list[Selected]:
    """The problems the eval will verify (those with a solution file), in its order, with their hashes."""
    from kb_mcp.campaign.selection import match_solution, select_problems
    from kb_mcp.harness.problem import ProblemError, load_problem

    out = []
    for ref in select_problems(list(args.problems), level=args.level, ids=args.ids):
        if match_solution(ref, args.solutions.resolve()) is None:
            continue
        try:
            out.append(Selected(name=ref.name, id=ref.id, hash=load_problem(str(ref.path)).hash))
        except ProblemError:
            continue  # the eval reports it; it has no baselines to seed
    return out


def _warm(ctx: Any) -> tuple[float, str]:
    """Starts the pool's workers (and the census worker on a GPU) and probes the compilers: (seconds, device)."""
    from kb_mcp.harness.builds.builds import toolchain

    t0 = time.monotonic()
    toolchain(ctx.sandbox)
    pool = ctx.workers
    info = pool.info()
    if info.cuda:
        pool.state()  # waits until the census worker is up too
    return time.monotonic() - t0, info.device


def add_eval_set(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """The arguments naming the problems and solutions a bench evaluates (this bench's and scale_bench's)."""
    parser.add_argument("problems", nargs="+" if required else "*", help="a KernelBench checkout (or problem "
                        "folders/files)")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help="solution files, matched by name")
    parser.add_argument("--level", type=int, default=2, help="KernelBench level (default 2)")
    parser.add_argument("--problems", dest="ids", help="problem ids (default: those the solutions folder has)")


# -- the baselines: timed once into a folder, seeded into each run's cache ----------------------------

def baseline_files(folder: Path) -> list[Path]:
    """The baseline cache files of `folder` (or of `folder`/baselines, a cache folder)."""
    from kb_mcp.harness.baselines import Baseline

    source = folder / "baselines" if (folder / "baselines").is_dir() else folder
    if not source.is_dir():
        raise SystemExit(f"--baselines-cache: no folder {folder}")
    files = []
    for path in sorted(source.glob("*.json")):
        if path.name == INDEX:
            continue
        try:
            Baseline.model_validate_json(path.read_text())
        except ValueError:
            print(f"--baselines-cache: {path.name} is not a baseline file: skipped", file=sys.stderr)
            continue
        files.append(path)
    return files


def seed(cache: Path, source: Path, leave_out: set[str]) -> int:
    """Copies `source`'s baseline files into `cache`'s baseline folder, but those of the problem hashes in
    `leave_out`; how many were copied."""
    from kb_mcp.harness.baselines import Baseline, BaselineCache

    target = BaselineCache(cache).dir
    target.mkdir(parents=True, exist_ok=True)
    copied = 0
    for path in baseline_files(source):
        if Baseline.model_validate_json(path.read_text()).problem_hash in leave_out:
            continue
        shutil.copyfile(path, target / path.name)
        copied += 1
    return copied


def cached_at_start(cache: Path, problems: list[Selected], info: Any, track: str) -> list[str]:
    """The problems whose baselines a verification would find in `cache` for the worker's GPU and torch."""
    from kb_mcp.harness.baselines import BaselineCache

    if not info.cuda:
        return []
    store = BaselineCache(cache)
    return [p.name for p in problems
            if store.get(p.hash, info.device, info.torch_version, need_compile=True, track=track) is not None]


def time_baselines(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """`--only baselines`: the selected problems' baselines timed on this GPU into root/baselines/
    (the cache files and index.json); what it measured, for eval_pipeline.json."""
    from kb_mcp.campaign.baselines_eval import BaselineRow, baselines_table
    from kb_mcp.harness.baselines import Baseline, BaselineCache
    from kb_mcp.kb.models import DEFAULT_TRACK
    from kb_mcp.tools.context import ToolContext

    problems = selected(args)
    if args.compile_only:  # nothing to start: a compile-only run has no GPU to time on
        rows = [BaselineRow(level=args.level, problem=p.name, status="needs_gpu", track=DEFAULT_TRACK,
                            note="--compile-only: baselines are timed on a GPU only") for p in problems]
        return {"wall_s": 0.0, "gpu_s": 0.0, "device": "", "rows": [r.model_dump(mode="json") for r in rows],
                "files": []}
    folder = root / "baselines-run"
    ctx = ToolContext(folder / "kb.json", cache_dir=folder / "cache", client_name="eval pipeline bench")
    try:
        start_s, device = _warm(ctx)
        print(f"[baselines] workers started in {start_s:.1f} s{f' on {device}' if device else ''}; timing "
              f"{len(problems)} problem(s)", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        ids = ",".join(str(p.id) for p in problems if p.id is not None)  # those with a solution only
        rows = baselines_table(folder / "table.json", ctx, list(args.problems), level=args.level, ids=ids or args.ids,
                               track=DEFAULT_TRACK, log=lambda text: print(f"[baselines] {text}", file=sys.stderr,
                                                                           flush=True))
        wall = time.monotonic() - t0
    finally:
        ctx.close()
    rows = [r for r in rows if r.problem in {p.name for p in problems}]
    out = root / "baselines"
    index = []
    for path in sorted(BaselineCache(folder / "cache").dir.glob("*.json")):  # the cache's files, not its locks
        base = Baseline.model_validate_json(path.read_text())
        name = next((p.name for p in problems if p.hash == base.problem_hash), None)
        if name is None:
            continue
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out / path.name)
        index.append({"problem": name, "file": path.name, "device": base.device, "torch": base.torch_version,
                      "track": base.track, "eager_ms": base.eager_ms, "compile_ms": base.compile_ms})
    if index:
        (out / INDEX).write_text(json.dumps(sorted(index, key=lambda e: e["problem"]), indent=1) + "\n")
    return {"wall_s": round(wall, 3), "gpu_s": round(sum(r.elapsed_s for r in rows), 3), "device": device,
            "rows": [r.model_dump(mode="json") for r in rows], "files": [e["file"] for e in index]}


def baselines_report(data: dict[str, Any], out: Path | None) -> str:
    """What `--only baselines` prints."""
    rows = data["rows"]
    lines = [f"{'problem':<40} {'status':<14} {'eager ms':>9} {'compile ms':>10} {'s':>6}"]
    for r in rows:
        eager = f"{r['eager_ms']:.3f}" if r.get("eager_ms") is not None else "-"
        comp = f"{r['compile_ms']:.3f}" if r.get("compile_ms") is not None else "-"
        lines.append(f"{r['problem'][:40]:<40} {r['status']:<14} {eager:>9} {comp:>10} {r['elapsed_s']:>6.1f}")
    needs = [r for r in rows if r["status"] == "needs_gpu"]
    if needs:
        lines.append(f"needs_gpu: {needs[0]['note'] or 'no CUDA GPU'}; no baselines timed, nothing to seed a run with")
    else:
        lines.append(f"baselines of {len(data['files'])} of {len(rows)} problem(s) on {data['device']}: "
                     f"{data['gpu_s']:.1f} s of GPU time, {data['wall_s']:.1f} s wall")
        if out is not None:
            lines.append(f"written: {out / 'baselines'} (the cache files and {INDEX}): copy it to "
                         "bench/results/eval-pipeline-baselines-h200/ and give it to --baselines-cache")
    return "\n".join(lines)


# -- one eval --------------------------------------------------------------------------------------

def run_mode(mode: str, jobs: int, args: argparse.Namespace, root: Path) -> ModeRun:
    """One eval in folders of its own (cold builds; baselines seeded where asked), timed from its first
    problem to its report."""
    from kb_mcp.campaign.eval_models import EvalOptions
    from kb_mcp.campaign.evaluate import evaluate
    from kb_mcp.tools.context import ToolContext

    folder = root / mode
    cache = folder / "cache"
    problems = selected(args)
    if args.baselines_cache is not None:
        from kb_mcp.campaign.selection import parse_ids

        wanted = parse_ids(args.uncached) if args.uncached else set()
        left = [p for p in problems if p.id in wanted]
        n = seed(cache, args.baselines_cache, {p.hash for p in left})
        print(f"[{mode}] {n} baseline file(s) copied from {args.baselines_cache} into its fresh cache"
              + (f" (left out: {', '.join(p.name for p in left)})" if left else ""), file=sys.stderr, flush=True)
    ctx = ToolContext(folder / "kb.json", cache_dir=cache, client_name="eval pipeline bench")
    options = EvalOptions(problems=list(args.problems), solutions=str(args.solutions), level=args.level,
                          ids=args.ids, compile_only=args.compile_only, build_jobs=jobs)
    try:
        start_s, device = _warm(ctx)
        seeded = cached_at_start(cache, problems, ctx.workers.info(), options.track.value)
        print(f"[{mode}] workers started in {start_s:.1f} s{f' on {device}' if device else ''}", file=sys.stderr)
        print(f"[{mode}] {_cache_text(seeded, problems, device)}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        result = evaluate(folder / "out", ctx, options, have_gpu=not args.compile_only,
                          progress=_progress(mode) if args.verbose else None,
                          log=lambda text: print(f"[{mode}] {text}", file=sys.stderr, flush=True))
        wall = time.monotonic() - t0
    finally:
        ctx.close()
    timed = [line.times for line in result.lines if line.times is not None]
    rows = [{"problem": line.problem, "verdict": line.verdict.value if line.verdict else None,
             "speedup": line.speedup, "note": line.note, "baseline": _origin(line, seeded),
             "baseline_cached": line.baseline_cached, "baseline_ahead": line.baseline_ahead,
             **(line.times.model_dump() if line.times else {})} for line in result.lines]
    verify = sum(t.verify_s for t in timed)
    ahead = sum(t.baselines_s for t in timed)
    return ModeRun(mode=mode, build_jobs=jobs, start_s=round(start_s, 3), wall_s=round(wall, 3),
                   gpu_s=round(verify + ahead, 3), verify_gpu_s=round(verify, 3), baselines_gpu_s=round(ahead, 3),
                   build_in_verify_s=round(sum(t.build_s for t in timed), 3),
                   wait_s=round(sum(t.wait_s for t in timed), 3), device=device,
                   baselines_cache=str(args.baselines_cache or ""), seeded=seeded, problems=rows)


def _cache_text(seeded: list[str], problems: list[Selected], device: str) -> str:
    if not device:
        return "no GPU: no baselines are timed or used"
    rest = [p.name for p in problems if p.name not in seeded]
    return (f"baselines from the cache for {device}: {len(seeded)} of {len(problems)}"
            + (f" ({', '.join(seeded)})" if seeded else "")
            + (f"; not cached, timed by this run: {', '.join(rest)}" if rest else ""))


def _origin(line: Any, seeded: list[str]) -> str:
    """Where a verification's baselines came from: `cache` (cached before the run), `ahead` (timed by
    the eval while a build finished), `verification` (timed inside it), `-` (nothing timed)."""
    if line.baseline_cached is None:
        return "-"
    if line.baseline_ahead:
        return "ahead"
    return "cache" if line.baseline_cached and line.problem in seeded else (
        "verification" if not line.baseline_cached else "cache (this run)")


def _progress(mode: str) -> Any:
    def show(problem: str, done: int, total: int, message: str) -> None:
        print(f"[{mode}] {problem}: {message}", file=sys.stderr, flush=True)

    return show


# -- the report --------------------------------------------------------------------------------------

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


def _num(row: dict[str, Any], key: str, width: int) -> str:
    value = row.get(key)
    return f"{value:>{width}.1f}" if isinstance(value, (int, float)) else f"{'-':>{width}}"


def table(serial: ModeRun | None, piped: ModeRun | None) -> str:
    """Per problem: both verdicts and speedups, where the baselines came from, where each run's time went."""
    rows = [f"{'problem':<36} {'serial':<12} {'pipelined':<12} {'baselines s/p':<22} {'s verify':>8} "
            f"{'s build':>7} {'p verify':>8} {'p wait':>6} {'p bl.':>5} {'p build':>7} {'speedup s/p':>11}"]
    s_rows = {p["problem"]: p for p in serial.problems} if serial else {}
    p_rows = {p["problem"]: p for p in piped.problems} if piped else {}
    for name in list(dict.fromkeys([*s_rows, *p_rows])):
        s, p = s_rows.get(name, {}), p_rows.get(name, {})
        speed = "/".join(f"{r['speedup']:.2f}" if r.get("speedup") else "-" for r in (s, p))
        origin = f"{s.get('baseline', '-')}/{p.get('baseline', '-')}"
        rows.append(f"{name[:36]:<36} {s.get('verdict')!s:<12} {p.get('verdict')!s:<12} {origin:<22} "
                    f"{_num(s, 'verify_s', 8)} {_num(s, 'build_s', 7)} {_num(p, 'verify_s', 8)} "
                    f"{_num(p, 'wait_s', 6)} {_num(p, 'baselines_s', 5)} {_num(p, 'build_s', 7)} {speed:>11}")
    return "\n".join(rows)


def _round(value: float | None) -> float | None:
    return round(value, 3) if value else None


def summary(serial: ModeRun | None, piped: ModeRun | None, compile_only: bool) -> dict[str, Any]:
    """The headline numbers (ratios over the GPU's work: verifications and baselines ahead)."""
    out: dict[str, Any] = {"target": TARGET, "meaningful": not compile_only}
    if serial is not None:
        out.update(serial_wall_s=serial.wall_s, gpu_s_serial=serial.gpu_s, serial_parts=serial.parts,
                   builds_in_serial_verifications_s=serial.build_in_verify_s)
    if piped is not None:
        out.update(pipelined_wall_s=piped.wall_s, gpu_s_pipelined=piped.gpu_s, pipelined_parts=piped.parts,
                   verify_gpu_s_pipelined=piped.verify_gpu_s, baselines_ahead_gpu_s=piped.baselines_gpu_s,
                   builds_in_pipelined_verifications_s=piped.build_in_verify_s,
                   pipelined_waits_for_builds_s=piped.wait_s,
                   ratio=_round(piped.wall_s / piped.gpu_s if piped.gpu_s else None),
                   ratio_verifications=_round(piped.wall_s / piped.verify_gpu_s if piped.verify_gpu_s else None))
    strict = None
    if serial is not None and piped is not None:
        strict = piped.wall_s / min(piped.gpu_s, serial.gpu_s) if piped.gpu_s and serial.gpu_s else None
        out.update(ratio_strict=_round(strict),
                   speedup_over_serial=_round(serial.wall_s / piped.wall_s if piped.wall_s else None),
                   verdicts_agree=not disagreements(serial, piped),
                   verdicts_the_same_word=exact_agreement(serial, piped))
    best = strict if strict is not None else out.get("ratio")
    out["met"] = (bool(best and best <= TARGET) if piped is not None else None) if not compile_only else None
    return out


def report(serial: ModeRun | None, piped: ModeRun | None, compile_only: bool) -> str:
    """The text the bench prints (either run may be missing: `--only`)."""
    s = summary(serial, piped, compile_only)
    any_run = piped or serial
    assert any_run is not None
    lines = [table(serial, piped), "",
             f"device: {any_run.device or 'none (compile-only)'}"
             + (f"; builds ahead: {piped.build_jobs} at a time" if piped else "")
             + (f"; baselines seeded from {any_run.baselines_cache}" if any_run.baselines_cache else "")]
    for run in (piped, serial):
        if run is None:
            continue
        parts = f" (the sum of {run.parts} calls)" if run.parts > 1 else ""
        lines.append(f"{run.mode}{parts}: wall {run.wall_s:.1f} s; GPU time {run.gpu_s:.1f} s (verifications "
                     f"{run.verify_gpu_s:.1f} s, lane held, builds excluded; baselines timed ahead "
                     f"{run.baselines_gpu_s:.1f} s); builds inside verifications {run.build_in_verify_s:.1f} s; "
                     f"waits for builds ahead {run.wait_s:.1f} s; worker start-up before the clock {run.start_s:.1f} s")
        lines.append(f"  baselines cached at the start: {len(run.seeded)} of {len(run.problems)}"
                     + (f" ({', '.join(run.seeded)})" if run.seeded else ""))
    if serial is not None and piped is not None:
        lines.append(f"serial / pipelined wall: {s['speedup_over_serial']}")
    if piped is not None:
        if s["ratio"] is None:
            lines.append("pipelined wall / GPU time: - (no GPU time measured)")
        else:
            verdict = ("(no GPU: not meaningful)" if compile_only else
                       f"target <= {TARGET}: {'met' if s['met'] else 'NOT met'}")
            strict = f"; over the smaller GPU time of the two runs: {s['ratio_strict']:.2f}" \
                if s.get("ratio_strict") else ""
            alone = f"{s['ratio_verifications']:.2f}" if s["ratio_verifications"] else "-"
            lines.append(f"pipelined wall / GPU time: {s['ratio']:.2f}{strict} (over the verifications alone: "
                         f"{alone}) {verdict}")
            if piped.parts > 1:
                lines.append(f"  (the pipelined run in {piped.parts} parts: each paid a first build of its own)")
    if serial is not None and piped is not None:
        differ = disagreements(serial, piped)
        same = f" ({exact_agreement(serial, piped)}/{len(serial.problems)} the very same word; faster and " \
               "slower count as one, a timing near 1.0x may fall either side)"
        lines.append("verdicts agree: yes" + same if not differ else "verdicts agree: NO\n  " + "\n  ".join(differ))
    return "\n".join(lines)


# -- several calls into one report -----------------------------------------------------------------

def merge(parts: list[ModeRun]) -> ModeRun:
    """Runs of one mode measured in separate calls over disjoint problems, as one run (sums)."""
    names = [p["problem"] for run in parts for p in run.problems]
    if len(names) != len(set(names)):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise SystemExit(f"--combine: {parts[0].mode} runs overlap ({', '.join(twice)}): give each problem once")

    def total(key: str) -> float:
        return round(sum(float(getattr(run, key)) for run in parts), 3)

    first = parts[0]
    return first.model_copy(update={
        "start_s": total("start_s"), "wall_s": total("wall_s"), "gpu_s": total("gpu_s"),
        "verify_gpu_s": total("verify_gpu_s"), "baselines_gpu_s": total("baselines_gpu_s"),
        "build_in_verify_s": total("build_in_verify_s"), "wait_s": total("wait_s"),
        "seeded": [n for run in parts for n in run.seeded], "parts": sum(run.parts for run in parts),
        "problems": [p for run in parts for p in run.problems]})


def combine(files: list[Path], out: Path | None) -> int:
    """`--combine`: several calls' eval_pipeline.json as one report (and eval_pipeline.json in --out)."""
    found: dict[str, list[ModeRun]] = {}
    baselines: list[dict[str, Any]] = []
    compile_only = False
    for path in files:
        data = json.loads(path.read_text())
        compile_only |= bool(data.get("compile_only"))
        for mode, run in (data.get("runs") or {}).items():
            found.setdefault(mode, []).append(ModeRun.model_validate(run))
        if data.get("baselines"):
            baselines.append(data["baselines"])
    runs = {mode: merge(parts) for mode, parts in found.items()}
    serial, piped = runs.get("serial"), runs.get("pipelined")
    if serial is None and piped is None:
        raise SystemExit("--combine: none of the files holds a serial or pipelined run")
    print(report(serial, piped, compile_only))
    for b in baselines:
        print(f"baselines call: {len(b['files'])} problem(s) on {b['device'] or 'no GPU'}, {b['gpu_s']:.1f} s of GPU "
              f"time (not in the runs' GPU time: they found them cached)")
    headline = summary(serial, piped, compile_only)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        result = {"combined": [str(f) for f in files], "compile_only": compile_only, "summary": headline,
                  "runs": {m: r.model_dump() for m, r in runs.items()}, "baselines": baselines or None}
        (out / RESULT).write_text(json.dumps(result, indent=1))
        print(f"written: {out / RESULT}")
    return 0 if headline.get("verdicts_agree", True) else 1


# -- the command -----------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eval_pipeline_bench.py", description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_eval_set(parser, required=False)  # not with --combine
    parser.add_argument("--build-jobs", type=int, default=None, help="builds ahead at once (default: the eval's)")
    parser.add_argument("--serial-first", action="store_true", help="run the serial eval first")
    parser.add_argument("--compile-only", action="store_true", help="no GPU: compile-only verifications")
    parser.add_argument("--only", choices=("pipelined", "serial", "baselines"),
                        help="one run only, or only the baselines (into --out/baselines/)")
    parser.add_argument("--baselines-cache", type=Path, default=None,
                        help="a folder of baseline files (--only baselines' --out/baselines) copied into each run's "
                             "cache before it starts")
    parser.add_argument("--uncached", metavar="IDS", default=None,
                        help="with --baselines-cache: problem ids whose baselines are left out (the runs time them)")
    parser.add_argument("--combine", type=Path, nargs="+", default=None, metavar="JSON",
                        help="merge the eval_pipeline.json of separate calls into one report")
    parser.add_argument("--out", type=Path, help="folder for eval_pipeline.json (and the runs' folders)")
    parser.add_argument("--verbose", action="store_true", help="print every progress update")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.combine:
        return combine(args.combine, args.out.resolve() if args.out else None)
    if not args.problems:
        parser.error("give a KernelBench checkout (or problem folders/files), or --combine")
    if args.uncached and args.baselines_cache is None:
        parser.error("--uncached leaves baselines out of --baselines-cache: give that too")
    from kb_mcp.harness.builds.ahead import default_jobs

    args.ids = args.ids or solution_ids(args.solutions, args.level)
    jobs = default_jobs() if args.build_jobs is None else args.build_jobs
    if jobs < 1:
        parser.error("--build-jobs must be at least 1 for the pipelined run")
    root = (args.out or Path(tempfile.mkdtemp(prefix="eval-pipeline-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"only": args.only, "compile_only": args.compile_only, "order": [], "summary": None,
                           "runs": {}}
    if args.only == "baselines":
        out["baselines"] = data = time_baselines(args, root)
        (root / RESULT).write_text(json.dumps(out, indent=1))
        print(baselines_report(data, root if data["files"] else None))
        print(f"written: {root / RESULT}")
        return 1 if any(r["status"] == "harness_error" for r in data["rows"]) else 0
    order = [("serial", 0), ("pipelined", jobs)] if args.serial_first else [("pipelined", jobs), ("serial", 0)]
    order = [(m, n) for m, n in order if args.only in (None, m)]
    out["order"] = [m for m, _ in order]
    runs: dict[str, ModeRun] = {}
    for mode, n in order:
        runs[mode] = run_mode(mode, n, args, root)
        out["runs"][mode] = runs[mode].model_dump()
        (root / RESULT).write_text(json.dumps(out, indent=1))  # what was measured so far
        print(f"[{mode}] wall {runs[mode].wall_s:.1f} s, GPU time {runs[mode].gpu_s:.1f} s", file=sys.stderr,
              flush=True)
    serial, piped = runs.get("serial"), runs.get("pipelined")
    print(report(serial, piped, args.compile_only))
    out["summary"] = headline = summary(serial, piped, args.compile_only)
    (root / RESULT).write_text(json.dumps(out, indent=1))
    print(f"written: {root / RESULT}")
    return 0 if headline.get("verdicts_agree", True) else 1


if __name__ == "__main__":
    sys.exit(main())
