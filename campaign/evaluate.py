"""`kb-mcp eval`: a folder of problems (and, optionally, a solution per problem) through the harness,
without an LLM, into the same report a campaign writes.

Each matched solution goes through `tools.compile_and_verify.run` on the tool context, exactly as
an agent's candidate does (isolated worker, secret input sets, integrity checks, the verdict stored
in the KB): an eval is never a side path around the harness. Its verdict becomes the problem's
"initial kernel" record in a campaign folder, so the campaign report (speedup over eager, over
torch.compile and over the better of the two, valid rate, geomean, fast_p) is built from it
unchanged. A rerun of the same folder skips problems whose solution was already evaluated (same
candidate id) and rebuilds the report.

A problem without a solution file is listed with the reason; its baselines are not timed here
(the harness times eager and torch.compile inside a verification).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.campaign.bench import attempt_from
from kb_mcp.campaign.models import CampaignConfig, CampaignStatus, InitialRecord
from kb_mcp.campaign.report import CampaignReport, report_from_store
from kb_mcp.campaign.report_render import write_report
from kb_mcp.campaign.selection import ProblemRef, SelectionError, match_solution, select_problems
from kb_mcp.campaign.store import CampaignError, CampaignStore
from kb_mcp.harness.problem import ProblemError, candidate_id, load_problem
from kb_mcp.harness.verdict import VerifyOptions
from kb_mcp.kb.models import DEFAULT_TRACK, Track, Verdict
from kb_mcp.tools import compile_and_verify
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext

ProgressFn = Callable[[str, int, int, str], None]  # (problem, done, total, message), as a campaign's
LogFn = Callable[[str], None]


class EvalError(CampaignError):
    """The eval cannot run as asked (selection, track, folder); the message says what to change."""


class EvalOptions(BaseModel):
    """What to evaluate."""

    model_config = ConfigDict(extra="forbid")

    problems: list[str] = Field(description="problem files, folders of them, or a KernelBench checkout")
    solutions: str | None = Field(None, description="folder of solution files, matched to problems by name")
    level: int | None = Field(None, ge=1, description="KernelBench level to take")
    ids: str | None = Field(None, description="problem ids and ranges, e.g. 1-20,40")
    track: Track = Field(DEFAULT_TRACK, description="precision track the solutions are verified in")
    compile_only: bool = Field(False, description="compile only (no GPU): verdict needs_gpu, nothing timed")


class EvalLine(BaseModel):
    """One problem's outcome, for the terminal."""

    model_config = ConfigDict(extra="forbid")

    problem: str
    solution: str | None = None
    verdict: Verdict | None = None
    speedup: float | None = None  # over the better of eager and torch.compile
    note: str = ""


class EvalResult(BaseModel):
    """The evaluated problems and where the report is."""

    model_config = ConfigDict(extra="forbid")

    folder: str
    lines: list[EvalLine]
    report_md: str
    report_json: str
    report: CampaignReport


def check_track(folder: Path, track: Track) -> None:
    """Refuses to evaluate in a folder that holds another track's results: one report never ranks
    two tracks together (each track is its own tolerance and its own scores)."""
    try:
        stored = CampaignStore(folder).read_status()
    except (OSError, ValueError):
        stored = None
    if stored is not None and stored.config.track != track:
        raise EvalError(
            f"{folder} holds results of the {stored.config.track.value} track; a {track.value} eval goes in a "
            f"folder of its own (--out), so that the two tracks are never ranked together"
        )


def _verify_options(options: EvalOptions) -> VerifyOptions:
    return VerifyOptions(compile_only=options.compile_only, track=options.track)


def evaluate(
    folder: Path,
    ctx: ToolContext,
    options: EvalOptions,
    *,
    have_gpu: bool = True,
    progress: ProgressFn | None = None,
    log: LogFn | None = None,
) -> EvalResult:
    """Verifies each selected problem's solution through the harness and writes the report in `folder`.

    `have_gpu` (the caller's look for a GPU) only words the note of a problem without a solution.
    """
    check_track(folder, options.track)
    try:
        refs = select_problems(list(options.problems), level=options.level, ids=options.ids)
    except SelectionError as exc:
        raise EvalError(str(exc)) from exc
    solutions = Path(options.solutions).expanduser().resolve() if options.solutions else None
    if solutions is not None and not solutions.is_dir():
        raise EvalError(f"solutions folder not found: {solutions}")
    store = CampaignStore(folder)
    store.acquire()
    try:
        _write_status(store, ctx, refs, options, "running")
        run = _Run(store, ctx, solutions, options, have_gpu, progress or _quiet, log or _silent, len(refs))
        lines = [run.one(ref, i) for i, ref in enumerate(refs)]
        _write_status(store, ctx, refs, options, "finished")
        report = report_from_store(store)
        write_report(report, store.report_dir)
    finally:
        store.release()
    return EvalResult(folder=str(folder), lines=lines, report_md=str(store.report_dir / "report.md"),
                      report_json=str(store.report_dir / "report.json"), report=report)


def _quiet(problem: str, done: int, total: int, message: str) -> None:
    """Progress sink when nobody shows progress."""


def _silent(message: str) -> None:
    """Log sink when nobody reads the log."""


def _write_status(store: CampaignStore, ctx: ToolContext, refs: list[ProblemRef], options: EvalOptions,
                  state: str) -> None:
    stored = store.read_status()
    config = CampaignConfig(problems=[str(r.path) for r in refs], iterations=1, steps=1, gradient_every=0,
                            review=False, compile_only=options.compile_only, models={}, kind="eval",
                            track=options.track)
    if stored is not None and stored.config.problems and set(stored.config.problems) - set(config.problems):
        config.problems = sorted(set(stored.config.problems) | set(config.problems))
    status = CampaignStatus(config=config, kb_path=str(ctx.kb_path), state=state,
                            message=f"eval of {len(refs)} problem(s), track {options.track.value}",
                            runs=(stored.runs if stored else 0) + (state == "running"))
    store.write_status(status)


class _Run:
    """One eval's fixed settings, so each problem's step reads as a short method."""

    def __init__(self, store: CampaignStore, ctx: ToolContext, solutions: Path | None, options: EvalOptions,
                 have_gpu: bool, progress: ProgressFn, log: LogFn, total: int) -> None:
        self.store, self.ctx, self.solutions, self.options = store, ctx, solutions, options
        self.have_gpu, self.progress, self.log, self.total = have_gpu, progress, log, total

    def _say(self, index: int, name: str, text: str) -> None:
        self.log(f"[{index + 1}/{self.total}] {name}: {text}")

    def one(self, ref: ProblemRef, index: int) -> EvalLine:
        """Evaluates one problem (or says why it could not) and stores its record."""
        name = ref.name
        self.progress(name, 0, 1, "matching a solution")
        solution = match_solution(ref, self.solutions) if self.solutions is not None else None
        if solution is None:
            note = self._no_solution_note()
            self._say(index, name, note)
            self.progress(name, 1, 1, "no solution")
            return EvalLine(problem=name, note=note)
        try:
            problem = load_problem(str(ref.path))
        except ProblemError as exc:
            self._say(index, name, str(exc))
            self.progress(name, 1, 1, "not a problem file")
            return EvalLine(problem=name, solution=str(solution), note=str(exc))
        source = solution.read_text(errors="replace")
        existing = self.store.initials().get(name)
        if existing is not None and existing.candidate_id == candidate_id(problem, source) and existing.final:
            self.progress(name, 1, 1, f"already evaluated: {existing.verdict.value if existing.verdict else '-'}")
            return _line(name, solution, existing, "already evaluated in this folder")
        self.progress(name, 0, 1, f"verifying {solution.name}")
        record = _verify(self.ctx, problem, ref, solution, self.options)
        self.store.write_initial(record)
        if record.candidate_id:
            self.store.save_kernel(name, record.candidate_id, source)
        line = _line(name, solution, record, record.error or "")
        self._say(index, name, (line.verdict.value if line.verdict else "error")
                  + (f", {line.speedup:.2f}x" if line.speedup else "") + (f" ({line.note})" if line.note else ""))
        self.progress(name, 1, 1, line.verdict.value if line.verdict else "error")
        return line

    def _no_solution_note(self) -> str:
        found = ("no solutions folder given" if self.solutions is None else
                 "no solution file matched (the problem's file name, or level_<L>_problem_<N>_sample_<S>_kernel.py)")
        if self.options.compile_only or not self.have_gpu:
            return f"{found}; timing its baselines needs a GPU (none here)"
        return f"{found}; its baselines are timed only beside a solution"


def _verify(ctx: ToolContext, problem: object, ref: ProblemRef, solution: Path, options: EvalOptions) -> InitialRecord:
    request = compile_and_verify.Request(problem=str(ref.path), candidate=str(solution),
                                         options=_verify_options(options))
    base = dict(problem=ref.name, problem_hash=problem.hash, problem_path=str(ref.path))  # type: ignore[attr-defined]
    try:
        result = compile_and_verify.run(ctx, request)
    except ToolError as exc:
        return InitialRecord(**base, error=f"compile_and_verify refused it: {exc}")
    attempt = attempt_from(result)
    stored = result.record
    return InitialRecord(**base, attempts=[attempt], accepted=stored.verdict.is_valid and not stored.flagged)


def _line(name: str, solution: Path, record: InitialRecord, note: str) -> EvalLine:
    final = record.final
    if not note and final is not None and not final.verdict.is_valid and final.verdict is not Verdict.needs_gpu:
        note = final.feedback.splitlines()[0][:160] if final.feedback else ""  # what the harness said, briefly
    return EvalLine(problem=name, solution=str(solution), verdict=record.verdict,
                    speedup=final.record.speedup_vs_baseline if final is not None else None, note=note)
