"""KernelBench problems through the five MCP tools, the way an agent uses them, on a GPU: the
numbers side by side, and a KB that learned from them.

    source .whl/prelude.sh && python3 bench/kernelbench_bench.py ../shared/kernelbench \\
        [--solutions bench/kernelbench_solutions] [--problems level2/14,level1/1] [--no-profile] \\
        [--budget-s 450] [--out "$OUT"] [--starter-kb examples/kb/h100-kernelbench.json]

The solutions folder holds one ModelNew per problem and a `manifest.json` naming, per solution,
the KernelBench problem file (relative to the checkout), the precision track it is verified in,
the KB optimization it applies and the state an agent would expect the reference to be in (used
only when the reference is not profiled). A `kb-mcp serve` is started on stdio and, per problem,
the bench calls: profile_kernel on the reference -> classify_state -> suggest_optimizations (is
the applied optimization among the suggestions?) -> compile_and_verify(solution, track) ->
record_outcome(state, optimization, candidate). Every number comes from the server's own
verdicts (eager and torch.compile timed beside the solution in the same worker).

The run keeps to a wall budget (--budget-s): a problem starts only while --problem-budget-s is
left, and the reference is profiled only while there is room for that too (else the manifest's
state, marked as such). A problem that fails is reported with whose failure it is (the solution,
the problem file, the request, the environment or kb-mcp) and the run goes on. --compile-only
runs the same calls without a GPU (nothing is profiled or timed; verdicts are needs_gpu).

Writes report.md and bench.json to --out; a run whose verdict carries precision evidence (kernels
on the tensor cores below the track's precision, judged by the precision probes) keeps it: the worst
probe's ratio and the scheme the harness names, in its bench.json row and under the report's table.
The server's KB (outcomes tagged with the problem's name and track) is --kb, or <out>/kb.json;
--starter-kb PATH also exports it, folded into one file, to PATH (`kb-mcp kb export`): the optional
starter KB users import with `kb-mcp kb import PATH` (README, "Starter KB"). Figures go to
docs/benchmarks.md with the device and date printed here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer

TRACKS = ("fp32", "tf32", "bf16", "fp16")


class Entry(BaseModel):
    """One solution of the manifest."""

    model_config = ConfigDict(extra="forbid")

    problem: str = Field(description="KernelBench problem file, relative to the checkout: level2/14_....py")
    solution: str = Field(description="solution file, relative to the manifest's folder")
    track: str = "fp32"
    optimization_id: str = Field(description="the seed KB optimization the solution applies")
    expected_state: str = Field(description="the state an agent would expect the reference in (used unprofiled)")
    allow: list[str] = Field(default_factory=list, description="library ops the solution keeps (a loosened verdict)")
    note: str = Field("", description="what the solution does, in a line (goes into the outcome's analysis)")

    @property
    def key(self) -> str:
        """`level2/14`: the level folder and the problem's id."""
        folder, _, name = self.problem.rpartition("/")
        return f"{folder}/{name.split('_', 1)[0]}"


class Manifest(BaseModel):
    """The solutions to run, in the order they run (the most telling first: a budget cut drops the tail)."""

    model_config = ConfigDict(extra="forbid")

    description: str = ""
    solutions: list[Entry]


class PrecisionEvidence(BaseModel):
    """The precision probes' word on a solution whose kernels compute on the tensor cores below its
    track (`compile_and_verify`'s `precision`, a `harness.judgment.probing.PrecisionCheck`): the worst probe's
    ratio (its error against a float64 reference over the strict reference's) and the scheme the
    harness names from the instructions and the numbers together."""

    model_config = ConfigDict(extra="forbid")

    status: str  # passed, failed, pending (the probes did not run), unjudged (none could run)
    precisions: list[str] = Field(default_factory=list)  # the lowered precisions the SASS showed: tf32, bf16, ...
    worst_probe: str | None = None
    worst_ratio: float | None = None  # None: no probe ran; inf: a non-finite output where the reference's is finite
    bound: float | None = None  # a solution passes at most this ratio on every probe
    probes: dict[str, float | None] = Field(default_factory=dict)  # every probe's ratio (None: it did not run)
    scheme: str = ""

    @field_serializer("worst_ratio")
    def _ratio_out(self, value: float | None) -> float | str | None:
        return "Infinity" if value is not None and math.isinf(value) else value

    @field_serializer("probes")
    def _probes_out(self, value: dict[str, float | None]) -> dict[str, float | str | None]:
        return {k: "Infinity" if v is not None and math.isinf(v) else v for k, v in value.items()}

    def line(self) -> str:
        """One line for the report: status, the worst probe and the scheme (whose wording carries the
        worst ratio and the bound; without a scheme they are written out)."""
        if self.worst_ratio is None:
            worst = "no probe ran"
        elif self.scheme:
            worst = f"worst probe {self.worst_probe}"
        else:
            ratio = "inf" if math.isinf(self.worst_ratio) else f"{self.worst_ratio:.3g}x"
            bound = f", bound {self.bound:g}x" if self.bound is not None else ""
            worst = f"worst {ratio} on {self.worst_probe}{bound}"
        return f"{self.status}, {worst}" + (f": {self.scheme}" if self.scheme else "")


def precision_evidence(result: dict[str, Any]) -> PrecisionEvidence | None:
    """The precision evidence of a `compile_and_verify` result, or None where the verdict has none
    (no kernel below the track's precision). The server sends a `harness.judgment.probing.PrecisionCheck`
    (a ratio of "Infinity" included): its own model reads it, and a record it does not take is
    kb-mcp's to fix, as any malformed result is."""
    raw = result.get("precision")
    if raw is None:
        return None
    from kb_mcp.harness.judgment.probing import PrecisionCheck

    check = PrecisionCheck.model_validate(raw)
    worst = check.worst
    return PrecisionEvidence(status=check.status, precisions=check.precisions,
                             worst_probe=worst.probe if worst is not None else None,
                             worst_ratio=worst.ratio if worst is not None else None, bound=check.bound,
                             probes={p.probe: p.ratio for p in check.probes}, scheme=check.scheme())


class ProblemRun(BaseModel):
    """What one problem's pass through the tools gave."""

    model_config = ConfigDict(extra="forbid")

    key: str
    problem: str
    track: str
    optimization_id: str
    allow: list[str] = Field(default_factory=list)
    state_id: str | None = None
    state_source: str = ""  # classified (from the reference's profile) or manifest
    profile_id: str | None = None
    suggested_rank: int | None = None  # 1-based place of optimization_id among the suggestions
    suggestions: list[str] = Field(default_factory=list)
    candidate_id: str | None = None
    verdict: str | None = None
    strength: str | None = None
    time_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    speedup_vs_baseline: float | None = None
    outcome_id: str | None = None
    recorded: bool = False
    fault: str = ""  # whose failure: solution, problem, request, environment, kb-mcp, budget, policy
    note: str = ""
    precision: PrecisionEvidence | None = None  # the precision probes' evidence, where the verdict carries it
    stage_s: dict[str, float] = Field(default_factory=dict)

    @property
    def speedup_vs_eager(self) -> float | None:
        """Eager time over ours."""
        return self.eager_ms / self.time_ms if self.eager_ms and self.time_ms else None

    @property
    def speedup_vs_compile(self) -> float | None:
        """torch.compile's time over ours."""
        return self.compile_ms / self.time_ms if self.compile_ms and self.time_ms else None


def load_manifest(path: Path) -> Manifest:
    """The manifest, or SystemExit with what is wrong with it."""
    try:
        return Manifest.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"kernelbench_bench: cannot read the manifest {path}: {exc}") from exc


def select(manifest: Manifest, wanted: str | None) -> list[Entry]:
    """The entries named by --problems (`level2/14`, `2/14`, or a file name's start), in manifest order."""
    if not wanted:
        return list(manifest.solutions)
    items = [w.strip() for w in wanted.split(",") if w.strip()]
    chosen = [e for e in manifest.solutions if any(_names(e, item) for item in items)]
    unknown = [item for item in items if not any(_names(e, item) for e in manifest.solutions)]
    if unknown:
        raise SystemExit(f"kernelbench_bench: --problems names no solution of the manifest: {', '.join(unknown)}")
    return chosen


def _names(entry: Entry, item: str) -> bool:
    stem = Path(entry.problem).stem
    return item in (entry.key, entry.key.removeprefix("level"), entry.problem) or stem.startswith(item)


class Budget:
    """The run's wall budget: whether another problem, or another profile, still fits."""

    def __init__(self, total_s: float, per_problem_s: float, profile_s: float) -> None:
        self.started = time.perf_counter()
        self.total_s, self.per_problem_s, self.profile_s = total_s, per_problem_s, profile_s

    def left(self) -> float:
        """Seconds left of the run's budget."""
        return self.total_s - (time.perf_counter() - self.started)

    def room_for_problem(self) -> bool:
        """A problem starts only while a whole problem's allowance is left."""
        return self.left() >= self.per_problem_s

    def room_for_profile(self) -> bool:
        """The reference is profiled only while the profile and a problem's allowance both fit."""
        return self.left() >= self.per_problem_s + self.profile_s


class Bench:
    """One MCP client session and the run's settings."""

    def __init__(self, client: Any, args: argparse.Namespace, root: Path, solutions: Path, budget: Budget) -> None:
        self.client, self.args, self.root, self.solutions, self.budget = client, args, root, solutions, budget

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """One tool call over MCP; raises ToolCallError when the tool answered isError."""
        from kb_mcp.clients.mcp_client import call_json

        return await call_json(self.client, tool, arguments, timeout_s=timeout_s)

    async def run(self, entry: Entry, index: int, total: int) -> ProblemRun:
        """One problem through the five tools; never raises for the problem's or the solution's failures."""
        from kb_mcp.clients.mcp_client import ToolCallError

        run = ProblemRun(key=entry.key, problem=Path(entry.problem).stem, track=entry.track,
                         optimization_id=entry.optimization_id, allow=entry.allow)
        say = _Say(index, total, entry.key, self.budget)
        problem, solution = self.root / entry.problem, self.solutions / entry.solution
        if not problem.is_file() or not solution.is_file():
            missing = problem if not problem.is_file() else solution
            run.fault, run.note = ("problem" if missing == problem else "solution"), f"not found: {missing}"
            say(run.note)
            return run
        stage = "diagnose"
        try:
            await self._diagnose(run, entry, problem, say)
            stage = "suggest_optimizations"
            await self._suggest(run, entry, say)
            stage = "compile_and_verify"
            await self._verify(run, entry, problem, solution, say)
            stage = "record_outcome"
            await self._record(run, entry, say)
        except ToolCallError as exc:
            run.fault = _whose(exc.whose, stage)
            run.note = f"{stage}: {exc.message.splitlines()[0][:300]}"
            say(f"failed ({run.fault}'s fault): {run.note}")
        except TimeoutError:
            run.fault, run.note = "environment", f"{stage}: no answer from the server in time"
            say(run.note)
        return run

    async def _diagnose(self, run: ProblemRun, entry: Entry, problem: Path, say: _Say) -> None:
        """profile_kernel on the reference and classify_state, or the manifest's state where that cannot run."""
        why_not = ("--no-profile" if self.args.no_profile else "--compile-only" if self.args.compile_only
                   else "" if self.budget.room_for_profile() else "the budget leaves no room for a profile")
        if not why_not:
            started = time.perf_counter()
            profile = await self.call("profile_kernel", {
                "problem": str(problem), "top": 4, "max_kernels": 50,
                "timeout_s": max(10.0, min(self.args.profile_timeout_s, self.budget.left() / 3)),
            }, timeout_s=self.args.profile_timeout_s + 60)
            run.stage_s["profile_kernel"] = time.perf_counter() - started
            if profile.get("status") == "profiled" and profile.get("profile_id"):
                run.profile_id = str(profile["profile_id"])
                started = time.perf_counter()
                classified = await self.call("classify_state", {"profile_id": run.profile_id, "max_kernels": 3},
                                             timeout_s=120)
                run.stage_s["classify_state"] = time.perf_counter() - started
                state = _state_of(classified)
                if state:
                    run.state_id, run.state_source = state, "classified"
                    say(f"profiled in {run.stage_s['profile_kernel']:.1f} s ({profile.get('method', '?')}), "
                        f"state {state}")
                    return
                why_not = "classify_state named no state"
            else:
                why_not = f"profile_kernel: {profile.get('status')} ({str(profile.get('summary', ''))[:120]})"
        run.state_id, run.state_source = entry.expected_state, "manifest"
        say(f"not profiled ({why_not}); state from the manifest: {run.state_id}")

    async def _suggest(self, run: ProblemRun, entry: Entry, say: _Say) -> None:
        """suggest_optimizations for the state and track: where does the applied optimization stand?"""
        assert run.state_id is not None
        offered = await self.call("suggest_optimizations", {"state_id": run.state_id, "k": 10, "track": entry.track,
                                                            "seed": 0}, timeout_s=60)
        run.suggestions = [str(s["id"]) for s in offered.get("suggestions", [])]
        if entry.optimization_id in run.suggestions:
            run.suggested_rank = run.suggestions.index(entry.optimization_id) + 1
        say(f"suggested: {', '.join(run.suggestions[:5])}; applying {entry.optimization_id} "
            + (f"(suggestion {run.suggested_rank})" if run.suggested_rank else "(not among the top 10)"))

    async def _verify(self, run: ProblemRun, entry: Entry, problem: Path, solution: Path, say: _Say) -> None:
        """compile_and_verify the solution in its track (with the manifest's allow-list, if any)."""
        options: dict[str, Any] = {"track": entry.track}
        if entry.allow:
            options["allow"] = entry.allow
        if self.args.compile_only:
            options["compile_only"] = True
        started = time.perf_counter()
        result = await self.call("compile_and_verify", {"problem": str(problem), "candidate": str(solution),
                                                        "options": options}, timeout_s=self.args.verify_timeout_s)
        run.stage_s["compile_and_verify"] = time.perf_counter() - started
        record = result["record"]
        run.candidate_id, run.verdict = record.get("candidate_id"), record.get("verdict")
        run.strength = record.get("strength")
        run.time_ms, run.eager_ms, run.compile_ms = record.get("time_ms"), record.get("eager_ms"), record.get(
            "compile_ms")
        run.speedup_vs_baseline = record.get("speedup_vs_baseline")
        run.precision = precision_evidence(result)
        summary = str(result.get("summary") or "").splitlines()
        if run.verdict not in ("faster", "slower", "needs_gpu"):
            run.fault = "solution"
            run.note = summary[0][:300] if summary else str(run.verdict)
        say(f"{run.verdict} in {run.stage_s['compile_and_verify']:.1f} s"
            + (f": {run.time_ms:.3f} ms, eager {_ms(run.eager_ms)}, torch.compile {_ms(run.compile_ms)}"
               if run.time_ms else "") + (f" ({run.note})" if run.note else ""))

    async def _record(self, run: ProblemRun, entry: Entry, say: _Say) -> None:
        """record_outcome (the state, the optimization, the candidate): the KB learns from every verdict it can
        credit; a loosened one (an allow-list) is refused by the server, and the bench says so."""
        if run.candidate_id is None:
            return
        if entry.allow:
            run.fault = run.fault or "policy"
            run.note = (run.note + "; " if run.note else "") + (
                f"not recorded: verified with allow={entry.allow}, a loosened verdict no KB score takes")
            say(run.note)
            return
        analysis = (f"KernelBench {entry.problem} (track {entry.track}), state {run.state_id} "
                    f"({run.state_source}): {entry.note} Verdict {run.verdict}"
                    + (f", {run.speedup_vs_baseline:.2f}x over the better of eager and torch.compile"
                       if run.speedup_vs_baseline else "") + ".")
        started = time.perf_counter()
        outcome = await self.call("record_outcome", {
            "state_id": run.state_id, "optimization_id": entry.optimization_id, "candidate_id": run.candidate_id,
            "analysis": analysis[:2000],
        }, timeout_s=60)
        run.stage_s["record_outcome"] = time.perf_counter() - started
        run.outcome_id, run.recorded = outcome.get("outcome_id"), bool(outcome.get("recorded"))
        say(f"outcome {run.outcome_id} ({'recorded' if run.recorded else 'already recorded'}; "
            f"{str(outcome.get('note', ''))[:120]})")


class _Say:
    """Progress lines: which problem, how much of the budget is left."""

    def __init__(self, index: int, total: int, key: str, budget: Budget) -> None:
        self.prefix, self.budget = f"[{index + 1}/{total}] {key}", budget

    def __call__(self, text: str) -> None:
        print(f"{self.prefix} ({self.budget.left():.0f} s left): {text}", flush=True)


def _state_of(classified: dict[str, Any]) -> str | None:
    """The state to act on: the whole reference's, else its heaviest kernel's."""
    overall = classified.get("overall") or {}
    if overall.get("state_id"):
        return str(overall["state_id"])
    for kernel in classified.get("kernels", []):
        if kernel.get("state_id"):
            return str(kernel["state_id"])
    return None


def _whose(whose: str, stage: str) -> str:
    """The server's word for whose failure it is, in the bench's terms."""
    if whose == "caller":
        return "problem" if stage in ("diagnose", "compile_and_verify") else "request"
    return whose or "kb-mcp"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} ms"


def _f(value: float | None, width: int, suffix: str = "") -> str:
    return f"{'-':>{width}s}" if value is None else f"{value:{width - len(suffix)}.3f}{suffix}"


def summarize(runs: list[ProblemRun]) -> dict[str, Any]:
    """Per track, the campaign report's summary (`campaign.report.track_summary`: valid rate,
    geomean speedups, fast_p over every problem attempted); tracks are never ranked together."""
    from kb_mcp.campaign.report import track_summary

    out: dict[str, Any] = {}
    for track in TRACKS:
        mine = [r for r in runs if r.track == track]
        if mine:
            out[track] = track_summary([_result(r) for r in mine])
    return out


def _result(r: ProblemRun) -> Any:
    """One problem's run as the campaign report's `ProblemResult` (the solution is its only kernel)."""
    from kb_mcp.campaign.report import ProblemResult

    valid = r.verdict in ("faster", "slower")
    return ProblemResult(problem=r.key, eager_ms=r.eager_ms, compile_ms=r.compile_ms, best_ms=r.time_ms,
                         best_speedup=r.speedup_vs_baseline if valid else None,
                         best_vs_eager=r.speedup_vs_eager if valid else None,
                         best_vs_compile=r.speedup_vs_compile if valid else None, valid=valid,
                         compiled=r.verdict not in (None, "compile_error"), track=r.track)


def table(runs: list[ProblemRun], summaries: dict[str, Any]) -> str:
    """The side-by-side table and the per-track summary, as printed and as report.md holds it."""
    lines = [f"{'problem':12s} {'track':5s} {'verdict':>11s} {'eager ms':>9s} {'compile ms':>10s} {'ours ms':>9s} "
             f"{'/eager':>8s} {'/compile':>8s} {'/better':>8s}  {'state':26s} {'optimization':28s} fault/note"]
    for r in runs:
        lines.append(
            f"{r.key:12s} {r.track:5s} {(r.verdict or '-'):>11s} {_f(r.eager_ms, 9)} {_f(r.compile_ms, 10)} "
            f"{_f(r.time_ms, 9)} {_f(r.speedup_vs_eager, 8, 'x')} {_f(r.speedup_vs_compile, 8, 'x')} "
            f"{_f(r.speedup_vs_baseline, 8, 'x')}  {(r.state_id or '-')[:26]:26s} {r.optimization_id[:28]:28s} "
            + (f"{r.fault}: " if r.fault else "") + r.note[:160])
    lines.append("")
    for track, s in summaries.items():
        lines.append(f"track {track}: {round(s.valid_rate * s.problems)}/{s.problems} valid; geomean over the better "
                     f"baseline {_f(s.speedup.geomean, 0, 'x').strip()}, over eager "
                     f"{_f(s.speedup_vs_eager.geomean, 0, 'x').strip()}; fast_0 {s.fast_p['0']:.0%}, "
                     f"fast_1 {s.fast_p['1']:.0%}, fast_2 {s.fast_p['2']:.0%}")
    probed = [r for r in runs if r.precision is not None]
    if probed:
        lines += ["", "precision probes (error against a float64 reference over the strict reference's, per solution "
                      "whose tensor-core kernels compute below its track):"]
        lines += [f"{r.key:12s} {r.precision.line()}" for r in probed if r.precision is not None]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("kernelbench", help="a KernelBench checkout (holding level1/, level2/)")
    parser.add_argument("--solutions", default=str(here / "kernelbench_solutions"),
                        help="folder of solutions with manifest.json (default: bench/kernelbench_solutions)")
    parser.add_argument("--manifest", help="manifest file (default: <solutions>/manifest.json)")
    parser.add_argument("--problems", help="which solutions: level2/14,1/1,88_MinGPT (default: all, manifest order)")
    parser.add_argument("--no-profile", action="store_true", help="skip profile_kernel: state from the manifest")
    parser.add_argument("--compile-only", action="store_true", help="no GPU: compile, verdict needs_gpu, nothing timed")
    parser.add_argument("--budget-s", type=float, default=450.0, help="wall budget of the whole run (default 450)")
    parser.add_argument("--problem-budget-s", type=float, default=35.0,
                        help="a problem starts only while this much budget is left (default 35)")
    parser.add_argument("--profile-timeout-s", type=float, default=60.0,
                        help="profile_kernel's own limit, and the room a profile needs in the budget (default 60)")
    parser.add_argument("--verify-timeout-s", type=float, default=400.0, help="client-side wait for one verdict")
    parser.add_argument("--out", default=os.environ.get("OUT", "out"))
    parser.add_argument("--kb", help="KB file the server uses (default: <out>/kb.json)")
    parser.add_argument("--starter-kb", help="export the KB, as one file, here after the run (the starter KB, e.g. "
                                             "examples/kb/h100-kernelbench.json; replaced if present)")
    return parser.parse_args(argv)


async def bench_main(args: argparse.Namespace) -> int:
    """Runs the selected problems through one stdio server session; writes report.md and bench.json."""
    from mcp import Client
    from mcp_types import Implementation

    from kb_mcp.clients.mcp_client import stdio_params

    root = Path(args.kernelbench).resolve()
    solutions = Path(args.solutions).resolve()
    manifest = load_manifest(Path(args.manifest) if args.manifest else solutions / "manifest.json")
    entries = select(manifest, args.problems)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    kb_path = Path(args.kb or out / "kb.json").resolve()
    kb_path.parent.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s, args.problem_budget_s, args.profile_timeout_s)
    device = _device(args.compile_only)
    print(f"device: {device}  date: {time.strftime('%Y-%m-%d %H:%MZ', time.gmtime())}  kb: {kb_path}  "
          f"problems: {len(entries)}  budget: {args.budget_s:.0f} s", flush=True)
    env = {"CUDA_VISIBLE_DEVICES": ""} if args.compile_only else {}
    runs: list[ProblemRun] = []
    async with Client(stdio_params(kb_path, env=env),
                      client_info=Implementation(name="kernelbench_bench", version="1")) as client:
        bench = Bench(client, args, root, solutions, budget)
        for i, entry in enumerate(entries):
            if not budget.room_for_problem():
                runs.append(ProblemRun(key=entry.key, problem=Path(entry.problem).stem, track=entry.track,
                                       optimization_id=entry.optimization_id, fault="budget",
                                       note=f"not started: {budget.left():.0f} s of the budget left"))
                print(f"[{i + 1}/{len(entries)}] {entry.key}: skipped, the budget is spent", flush=True)
                continue
            started = time.perf_counter()
            run = await bench.run(entry, i, len(entries))
            run.stage_s["total"] = time.perf_counter() - started
            runs.append(run)
            write_outputs(out, runs, device, budget, kb_path, args.compile_only)  # a killed run keeps what it did
    text = write_outputs(out, runs, device, budget, kb_path, args.compile_only)
    print("\n" + text + f"\n\nwall {time.perf_counter() - budget.started:.0f} s", flush=True)
    print(f"report: {out / 'report.md'}\nbench.json: {out / 'bench.json'}\nkb: {kb_path}", flush=True)
    if args.starter_kb:
        export_starter(kb_path, Path(args.starter_kb).resolve())
    return 0 if any(r.verdict for r in runs) else 1


def write_outputs(out: Path, runs: list[ProblemRun], device: str, budget: Budget, kb_path: Path,
                  compile_only: bool) -> str:
    """report.md and bench.json for the problems run so far; returns the table."""
    wall = time.perf_counter() - budget.started
    summaries = summarize(runs)
    text = table(runs, summaries)
    (out / "report.md").write_text(
        f"# KernelBench through the MCP tools\n\nDevice: {device}; {time.strftime('%Y-%m-%d %H:%MZ', time.gmtime())}; "
        f"wall {wall:.0f} s; KB {kb_path}.\n\n```\n{text}\n```\n")
    (out / "bench.json").write_text(json.dumps({
        "device": device, "wall_s": wall, "kb": str(kb_path), "compile_only": compile_only,
        "runs": [r.model_dump(mode="json") | {"speedup_vs_eager": r.speedup_vs_eager,
                                               "speedup_vs_compile": r.speedup_vs_compile} for r in runs],
        "tracks": {track: s.model_dump(mode="json") for track, s in summaries.items()}}, indent=1))
    return text


def export_starter(kb_path: Path, dest: Path) -> None:
    """The run's KB folded into one file at `dest` by `kb-mcp kb export` (journal applied, no lock or
    artifacts beside it), ready for `kb-mcp kb import`."""
    import subprocess

    dest.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb_path), "kb", "export", str(dest),
                           "--force"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"kernelbench_bench: exporting the starter KB failed: {done.stderr.strip()[-400:]}")
    print(f"starter KB: {dest}", flush=True)


def _device(compile_only: bool) -> str:
    if compile_only:
        return "none (compile-only)"
    from kb_mcp.server.gpu import detect_gpus

    gpus = detect_gpus()
    if not gpus:
        raise SystemExit("kernelbench_bench: no GPU found; run with --compile-only to check the plumbing without one")
    return str(gpus[0])


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return asyncio.run(bench_main(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
