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

The eval is pipelined (`campaign.eval_pipeline`): while the GPU verifies one solution, the next
solutions' `load_inline` extensions are built ahead on the remaining CPU cores, by the harness's build
service, into the cache the worker looks them up in (`harness.builds.ahead`), so cold builds hide behind
verifications. A build ahead is never a verdict: the verification runs as it would without it, and a
solution whose build failed ahead is built and judged by the verification itself. `build_jobs` 0 is
the serial eval. Progress shows each problem's phase and the whole run's ETA (`campaign.eta`).

While a verification waits for its build ahead, the GPU times the baselines of the eval's problems not
cached yet (`campaign.eval_baselines`), so the verification finds them cached. A problem whose build is
ready is verified at once (its baselines, when not cached, are timed by the pool first, inside the
verification's lane hold). Each line says whether its verification found its baseline cached
(`baseline_cached`) and whether this eval timed it ahead (`baseline_ahead`); `StepTimes.baselines_s` is
the GPU time a step's wait spent on them.

Given a cluster (`campaign.cluster`: `--gpus N`, `--cluster ADDRESS`), the verifications run on its
workers instead, as many at once as it has GPUs, and each verdict is stored here as it comes back
(the workers build what they verify; the KB and the folder are written by this process alone).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kb_mcp.campaign.bench import attempt_from
from kb_mcp.campaign.cluster_models import ClusterError
from kb_mcp.campaign.eta import OVERALL, Eta
from kb_mcp.campaign.eval_baselines import BaselinesAhead, Pending
from kb_mcp.campaign.eval_models import EvalError, EvalLine, EvalOptions, EvalResult, StepTimes
from kb_mcp.campaign.eval_pipeline import Pipeline
from kb_mcp.campaign.models import CampaignConfig, CampaignStatus, InitialRecord, Retry
from kb_mcp.campaign.report import report_from_store
from kb_mcp.campaign.report_render import write_report
from kb_mcp.campaign.selection import ProblemRef, SelectionError, eval_mode, match_solution, select_problems
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.harness.builds.ahead import AheadOutcome, BuildsAhead, default_jobs, target_for
from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.problem import Problem, ProblemError, candidate_id, load_problem
from kb_mcp.kb.models import Track, Verdict
from kb_mcp.tools import compile_and_verify
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext

if TYPE_CHECKING:
    from kb_mcp.campaign.cluster import Cluster

MAX_WAITING = 256  # problems of an eval on a cluster waiting for a worker at once (each a thread here)
ProgressFn = Callable[[str, int, int, str], None]  # (problem, done, total, message), as a campaign's;
# the problem `eta.OVERALL` carries the whole run's (verifications done, to do, the ETA)
LogFn = Callable[[str], None]


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


def _verify_options(options: EvalOptions, level: int | None = None) -> VerifyOptions:
    """The options of a problem's verification: its level decides the mode unless one was given."""
    return VerifyOptions(compile_only=options.compile_only, track=options.track,
                         mode=eval_mode(level, options.mode))


def evaluate(
    folder: Path,
    ctx: ToolContext,
    options: EvalOptions,
    *,
    have_gpu: bool = True,
    progress: ProgressFn | None = None,
    log: LogFn | None = None,
    cluster: Cluster | None = None,
) -> EvalResult:
    """Verifies each selected problem's solution through the harness and writes the report in `folder`,
    building the next solutions ahead while one verifies (`options.build_jobs`; see the module docstring),
    or on the workers of `cluster`.

    `have_gpu` (the caller's look for a GPU) only words the note of a problem without a solution.
    """
    check_track(folder, options.track)
    try:
        refs = select_problems(list(options.problems), level=options.level, ids=options.ids)
    except SelectionError as exc:
        raise EvalError(str(exc), whose=exc.whose) from exc
    solutions = Path(options.solutions).expanduser().resolve() if options.solutions else None
    if solutions is not None and not solutions.is_dir():
        raise EvalError(f"solutions folder not found: {solutions}")
    store = CampaignStore(folder)
    store.acquire()
    seen = len(cluster.retried) if cluster is not None else 0  # a cluster may serve several evals
    retried: list[Retry] = []
    try:
        _write_status(store, ctx, refs, options, "running")
        run = _Run(store, ctx, solutions, options, have_gpu, progress or _quiet, log or _silent, len(refs))
        plan = [run.plan(ref, i) for i, ref in enumerate(refs)]
        try:
            lines = run.all(plan) if cluster is None else run.spread(plan, cluster)
        finally:  # what this run re-ran, kept even where it stops early (the report lists every run's)
            retried = list(cluster.retried[seen:]) if cluster is not None else []
            store.write_retried(retried)
        _write_status(store, ctx, refs, options, "finished")
        report = report_from_store(store)
        write_report(report, store.report_dir)
    finally:
        store.release()
    return EvalResult(folder=str(folder), lines=lines, report_md=str(store.report_dir / "report.md"),
                      report_json=str(store.report_dir / "report.json"), report=report, retried=retried)


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


@dataclass
class _Planned:
    """One selected problem, matched and read before anything runs."""

    index: int
    ref: ProblemRef
    solution: Path | None = None
    problem: Problem | None = None
    source: str = ""
    done: EvalLine | None = None  # decided without a verification: no solution, not a problem, evaluated already
    message: str = ""  # its progress message, when decided so
    say: bool = False  # whether the log says why


@dataclass
class _Remote:
    """One problem's verification on a cluster, as its thread hands it back."""

    record: InitialRecord
    worker: str | None = None  # which worker verified it
    wall_s: float = 0.0  # the step, waiting for a free worker included
    verify_s: float = 0.0  # the verification on the worker
    build_s: float = 0.0  # building inside it
    baseline_cached: bool | None = None  # the verification found its baselines cached (None: nothing timed)




class _Run:
    """One eval's fixed settings, so each problem's step reads as a short method."""

    def __init__(self, store: CampaignStore, ctx: ToolContext, solutions: Path | None, options: EvalOptions,
                 have_gpu: bool, progress: ProgressFn, log: LogFn, total: int) -> None:
        self.store, self.ctx, self.solutions, self.options = store, ctx, solutions, options
        self.have_gpu, self.progress, self.log, self.total = have_gpu, progress, log, total
        self.eta = Eta(0)
        self.pipe: Pipeline[str, AheadOutcome] = Pipeline(_nothing, 0)
        self.fill: BaselinesAhead | None = None  # what the GPU does while a step waits for its build
        # The per-problem step, after the problem's builds ahead are done: (its line, seconds its
        # worker spent building, seconds the step took). An eval of another kind sets its own.
        self.step: Callable[[_Planned, Callable[[str], None]], tuple[EvalLine, float, float]] = self.verify

    def _say(self, index: int, name: str, text: str) -> None:
        self.log(f"[{index + 1}/{self.total}] {name}: {text}")

    def plan(self, ref: ProblemRef, index: int) -> _Planned:
        """Matches the problem's solution and reads both (nothing runs), or says why it needs no verification."""
        name = ref.name
        self.progress(name, 0, 1, "matching a solution")
        solution = match_solution(ref, self.solutions) if self.solutions is not None else None
        if solution is None:
            return _Planned(index, ref, done=EvalLine(problem=name, note=self._no_solution_note()),
                            message="no solution", say=True)
        try:
            problem = load_problem(str(ref.path))
        except ProblemError as exc:
            return _Planned(index, ref, solution, done=EvalLine(problem=name, solution=str(solution), note=str(exc)),
                            message="not a problem file", say=True)
        source = solution.read_text(errors="replace")
        existing = self.store.initials().get(name)
        if existing is not None and existing.candidate_id == candidate_id(problem, source) and existing.final:
            return _Planned(index, ref, solution, problem, source,
                            done=_line(name, solution, existing, "already evaluated in this folder"),
                            message=f"already evaluated: {existing.verdict.value if existing.verdict else '-'}")
        return _Planned(index, ref, solution, problem, source)

    def all(self, plan: list[_Planned]) -> list[EvalLine]:
        """Each problem's step in order, the next solutions built ahead meanwhile."""
        todo = [p for p in plan if p.done is None]
        self.eta = Eta(len(todo))
        builder = self._builder(todo)
        jobs = self._jobs() if builder is not None else 0
        self.fill = self._baselines_ahead(todo) if builder is not None and jobs else None
        with Pipeline(builder.build if builder else _nothing, jobs, builder.stop if builder else _none,
                      self.log) as self.pipe:
            if builder is not None:
                ahead = [p for p in todo if builder.units(p.source)]
                for p in ahead:
                    self.pipe.submit(p.index, p.source)
                if ahead:
                    target = builder.target
                    self.log(f"building {len(ahead)} solution(s) ahead, {jobs} at a time, for "
                             + ("compile-only checks" if target.compile_only else
                                f"{target.arch}, torch {target.torch_version}") + ", while the verifications run")
            return [self.one(p) for p in plan]

    def _jobs(self) -> int:
        return default_jobs() if self.options.build_jobs is None else self.options.build_jobs

    def _builder(self, todo: list[_Planned]) -> BuildsAhead | None:
        """What builds ahead, for the GPU and torch of the pool's worker (started here: the first
        verification needs it anyway); None for a serial eval, or when no worker starts (each
        verification then says why)."""
        if not todo or not self._jobs():
            return None
        try:
            pool = self.ctx.workers
            info = pool.info()
        except RuntimeError as exc:  # no sandbox, no worker: the verifications report it
            self.log(f"no builds ahead: {exc}")
            return None
        options = _verify_options(self.options)
        return BuildsAhead(pool.cache_dir, pool.sandbox, target_for(info, options, pool.no_cuda),
                           options.compile_timeout_s)

    def _baselines_ahead(self, todo: list[_Planned]) -> BaselinesAhead | None:
        """The baselines to time while steps wait for their builds: those of `todo` not cached for the
        pool's GPU; None without a GPU (compile-only, or a worker without CUDA)."""
        if self.options.compile_only:
            return None
        try:
            pool = self.ctx.workers
            info = pool.info()
        except RuntimeError:  # the verifications report it
            return None
        if pool.no_cuda or not info.cuda:
            return None
        pending = [Pending(p.index, p.ref.name, p.problem) for p in todo if p.problem is not None]
        fill = BaselinesAhead(pool, _verify_options(self.options), pending, self._say)
        if fill.left:
            self.log(f"baselines of {len(fill.left)} of {len(todo)} problem(s) not cached for {info.device}: the GPU "
                     "times them while verifications wait for their builds ahead")
        return fill

    def _report(self, name: str, message: str, started: float) -> None:
        """The problem's progress (a step under way since `started`), and the whole run's."""
        self.progress(name, 0, 1, message)
        self._overall(time.monotonic() - started)

    def _overall(self, running_for: float = 0.0) -> None:
        """The whole run's progress: verifications done of those to do, the ETA, builds ahead."""
        built, ahead = self.pipe.counts()
        extra = f" · {built}/{ahead} built ahead" if ahead else ""
        self.progress(OVERALL, len(self.eta.times), self.eta.todo, self.eta.text(running_for) + extra)

    def one(self, p: _Planned) -> EvalLine:
        """Evaluates one problem (or says why it needs no verification): waits for its builds ahead,
        then runs the step (`self.step`), timing both."""
        name = p.ref.name
        if p.done is not None:
            if p.say:
                self._say(p.index, name, p.done.note)
            self.progress(name, 1, 1, p.message)
            return p.done
        t0 = time.monotonic()
        self._overall()
        fill = self.fill
        before = fill.seconds if fill is not None else 0.0
        waited, _ = self.pipe.claim(
            p.index, lambda s: self._report(name, f"waiting for its build ahead ({s:.0f} s)", t0),
            idle=fill.idle(p.index, name, lambda text: self._report(name, text, t0)) if fill is not None else None)
        baselines_s = fill.seconds - before if fill is not None else 0.0
        line, build_s, step_s = self.step(p, lambda text: self._report(name, text, t0))
        if fill is not None and p.index in fill.timed:
            line = line.model_copy(update={"baseline_ahead": True})
        return self._finished(p, line, time.monotonic() - t0, waited, build_s, step_s, baselines_s)

    def _finished(self, p: _Planned, line: EvalLine, wall: float, waited: float, build_s: float,
                  step_s: float, baselines_s: float = 0.0) -> EvalLine:
        """A problem's step is over: the ETA, the log and the progress hear of it; its line with its times."""
        self.eta.finished(wall)
        times = StepTimes(wall_s=round(wall, 3), wait_s=round(waited, 3), build_s=round(build_s, 3),
                          verify_s=round(max(0.0, step_s - build_s), 3), baselines_s=round(baselines_s, 3))
        self._say(p.index, p.ref.name, (line.verdict.value if line.verdict else "error")
                  + (f", {line.speedup:.2f}x" if line.speedup else "") + (f" ({line.note})" if line.note else "")
                  + (f" [{line.worker}]" if line.worker else ""))
        self.progress(p.ref.name, 1, 1, line.verdict.value if line.verdict else "error")
        self._overall()
        return line.model_copy(update={"times": times})

    def spread(self, plan: list[_Planned], cluster: Cluster) -> list[EvalLine]:
        """Every problem's verification on the cluster's workers, as many at once as it has slots; each
        verdict stored here as it comes back, in the order they finish."""
        todo = [p for p in plan if p.done is None]
        self.eta = Eta(len(todo), lanes=cluster.capacity)
        lines = {p.index: self.one(p) for p in plan if p.done is not None}
        self._overall()
        # a thread per problem waiting its turn: the cluster lets as many run as it has slots now
        with cf.ThreadPoolExecutor(max(1, min(len(todo), MAX_WAITING)), thread_name_prefix="kb-mcp-remote") as pool:
            running = {pool.submit(self._remote, p, cluster): p for p in todo}
            for future in cf.as_completed(running):
                p = running[future]
                done = future.result()
                self.store.write_initial(done.record)
                if done.record.candidate_id:
                    self.store.save_kernel(p.ref.name, done.record.candidate_id, p.source)
                assert p.solution is not None
                line = _line(p.ref.name, p.solution, done.record, done.record.error or "")
                line = line.model_copy(update={"worker": done.worker, "baseline_cached": done.baseline_cached})
                lines[p.index] = self._finished(p, line, done.wall_s, 0.0, done.build_s, done.verify_s)
        return [lines[p.index] for p in plan]

    def _remote(self, p: _Planned, cluster: Cluster) -> _Remote:
        """One solution verified on a worker of the cluster, its verdict stored in the KB (in a thread of
        this process)."""
        from kb_mcp.campaign.cluster import verify_on

        self.progress(p.ref.name, 0, 1, "waiting for a worker of the cluster")
        t0 = time.monotonic()
        try:
            result, remote = verify_on(cluster, self.ctx, _request(p, self.options))
        except ToolError as exc:
            return _Remote(_refused(p, exc), wall_s=time.monotonic() - t0)
        except ClusterError as exc:
            return _Remote(InitialRecord(**_base(p), error=str(exc)), wall_s=time.monotonic() - t0)
        return _Remote(_initial(p, result, remote.seconds), remote.where, time.monotonic() - t0, remote.seconds,
                       result.compile.seconds, result.timings.baseline_cached if result.timings is not None else None)

    def verify(self, p: _Planned, report: Callable[[str], None]) -> tuple[EvalLine, float, float]:
        """The eval's step: the solution through compile_and_verify, its record stored; (its line, the
        seconds its worker spent building, the seconds the verification took)."""
        assert p.solution is not None
        report(f"verifying {p.solution.name}")
        record, build_s, verify_s, cached = _verify(self.ctx, p, self.options, report)
        self.store.write_initial(record)
        if record.candidate_id:
            self.store.save_kernel(p.ref.name, record.candidate_id, p.source)
        line = _line(p.ref.name, p.solution, record, record.error or "")
        return line.model_copy(update={"baseline_cached": cached}), build_s, verify_s

    def _no_solution_note(self) -> str:
        found = ("no solutions folder given" if self.solutions is None else
                 "no solution file matched (the problem's file name, or level_<L>_problem_<N>_sample_<S>_kernel.py)")
        if self.options.compile_only or not self.have_gpu:
            return f"{found}; timing its baselines needs a GPU (none here)"
        return f"{found}; its baselines are timed only beside a solution"


def _nothing(source: str) -> AheadOutcome:
    """Work ahead of a serial eval: none."""
    return AheadOutcome()


def _none() -> None:
    """Nothing to stop."""


def _request(p: _Planned, options: EvalOptions) -> compile_and_verify.Request:
    """The compile_and_verify request of a problem's solution."""
    return compile_and_verify.Request(problem=str(p.ref.path), candidate=str(p.solution),
                                      options=_verify_options(options, p.ref.level))


def _base(p: _Planned) -> dict[str, str]:
    """The fields naming the problem in its record."""
    assert p.problem is not None
    return dict(problem=p.ref.name, problem_hash=p.problem.hash, problem_path=str(p.ref.path))


def _refused(p: _Planned, exc: ToolError) -> InitialRecord:
    """The record of a solution compile_and_verify stored no verdict on (the message says why)."""
    return InitialRecord(**_base(p), error=f"compile_and_verify refused it: {exc}")


def _initial(p: _Planned, result: compile_and_verify.Result, seconds: float) -> InitialRecord:
    """The problem's first-kernel record from compile_and_verify's result (the stored verdict)."""
    attempt = attempt_from(result)
    attempt.wall_s = round(seconds, 3)
    stored = result.record
    return InitialRecord(**_base(p), attempts=[attempt], accepted=stored.verdict.is_valid and not stored.flagged)


def _verify(ctx: ToolContext, p: _Planned, options: EvalOptions,
            phase: Callable[[str], None]) -> tuple[InitialRecord, float, float, bool | None]:
    """The solution through compile_and_verify: (its record, seconds spent building (its own builds before
    the lane and its worker's), seconds the verification took, whether its baselines came from the cache:
    None when it timed nothing)."""

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        phase(message or "verifying")

    t0 = time.monotonic()
    try:
        result = compile_and_verify.run(ctx, _request(p, options), progress)
    except ToolError as exc:
        return _refused(p, exc), 0.0, time.monotonic() - t0, None
    seconds = time.monotonic() - t0
    cached = result.timings.baseline_cached if result.timings is not None else None
    # a build the verification made itself before its lane (not ahead) is building inside it all the same
    built = result.compile.seconds + result.phases_s.get("build_first", 0.0)
    return _initial(p, result, seconds), built, seconds, cached


def _line(name: str, solution: Path, record: InitialRecord, note: str) -> EvalLine:
    final = record.final
    if not note and final is not None and not final.verdict.is_valid and final.verdict is not Verdict.needs_gpu:
        note = final.feedback.splitlines()[0][:160] if final.feedback else ""  # what the harness said, briefly
    return EvalLine(problem=name, solution=str(solution), verdict=record.verdict,
                    speedup=final.record.speedup_vs_baseline if final is not None else None, note=note)
