"""The autonomous campaign loop: problems x iterations x rollout steps, resumable.

For each problem: generate a first CUDA kernel (with a compile/verify fix loop), then run
`iterations` rollout trajectories of `steps` steps. Each step profiles the trajectory's current
kernel, classifies its state, samples optimizations from the KB by weighted top-k, has the
lowering agent apply one, verifies it (fixing up to N times on compiler and verifier messages),
has it reviewed, records the outcome in the KB (numeric update), and moves the trajectory on when
the new kernel is faster. Every U recorded outcomes the textual gradient edits the KB.

Every finished unit is written as one raw record (`campaign.store`) before the next starts,
so a rerun with the same folder continues where the last run stopped, and the report and best
kernels are recomputed from those records. Trajectories run in parallel threads (`parallel`).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from kb_mcp.campaign.agent_base import AgentFailed, Conversation
from kb_mcp.campaign.agent_kernel import (
    GENERATE_SYSTEM,
    LOWER_SYSTEM,
    KernelAnswer,
    changed_kernel_parser,
    fix_request,
    generate_request,
    lower_request,
    parse_kernel_answer,
    review_fix_request,
)
from kb_mcp.campaign.agent_review import REVIEW_SYSTEM, parse_review, review_request
from kb_mcp.campaign.bench import Bench, BenchError, KernelDiagnosis
from kb_mcp.campaign.best import write_best_kernels
from kb_mcp.campaign.models import (
    AttemptRecord,
    CampaignConfig,
    CampaignStatus,
    InitialRecord,
    ReviewRecord,
    StepRecord,
    UnitRecord,
    problem_name,
)
from kb_mcp.campaign.report import CampaignReport, build_report, pick_best
from kb_mcp.campaign.report_render import write_report
from kb_mcp.campaign.store import CampaignError, CampaignStore
from kb_mcp.clients.llm import LLMClient, LLMError, Role
from kb_mcp.harness.problem import Problem, ProblemError, load_problem
from kb_mcp.kb.models import Verdict, utcnow

ProblemProgress = Callable[[str, int, int, str], None]
"""progress(problem, units done, units total, message): per-problem progress (the console draws a bar per
problem; a job folds it into one `kb.progress.Progress`); called from the thread that runs `run`."""


def _quiet(problem: str, done: int, total: int, message: str) -> None:
    pass


class CampaignStopped(Exception):
    """The campaign stopped before finishing (stop requested, or the LLM endpoint failed); rerun to resume."""


class CampaignAborted(KeyboardInterrupt):
    """A second interrupt: the campaign returns at once while steps may still be in flight in other
    threads. Nothing on disk is half-written, but the harness may still be busy: exit the process."""


@dataclass
class _Kernel:
    candidate_id: str
    source: str
    time_ms: float | None


@dataclass
class _ProblemRun:
    problem: Problem
    initial: InitialRecord | None
    steps: list[StepRecord] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.problem.name


def _usable_now(attempt: AttemptRecord, compile_only: bool) -> bool:
    """Whether a candidate may go on (review, acceptance): correct and timed, or compiled when no GPU."""
    if compile_only:
        return attempt.verdict == Verdict.needs_gpu or (attempt.verdict.is_valid and not attempt.record.flagged)
    return attempt.verdict.is_valid and not attempt.record.flagged and attempt.record.time_ms is not None


def _seed(*parts: object) -> int:
    digest = hashlib.sha256("\0".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


class Campaign:
    """One campaign folder, run (or resumed) with a bench, an LLM and a progress sink."""

    def __init__(
        self,
        config: CampaignConfig,
        store: CampaignStore,
        bench: Bench,
        llm: LLMClient,
        *,
        kb_path: str,
        progress: ProblemProgress = _quiet,
        log: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.config = config
        self.store = store
        self.bench = bench
        self.llm = llm
        self.kb_path = kb_path
        self.progress = progress
        self.log = log
        self.stop = threading.Event()
        self._gradient_lock = threading.Lock()
        self._runs: dict[str, _ProblemRun] = {}
        self._done: dict[str, int] = {}
        self._events: list[tuple[str, int, str]] = []  # (problem, done, message) from worker threads
        self._events_lock = threading.Lock()

    # -- setup and resume ------------------------------------------------------------------------

    def _open(self) -> CampaignStatus:
        status = self.store.read_status()
        if status is None:
            status = CampaignStatus(config=self.config, kb_path=self.kb_path)
        else:
            old = status.config
            if old.problems != self.config.problems:
                raise CampaignError(
                    f"{self.store.root} holds a campaign over other problems; use another folder, "
                    "or rerun without problems to resume it"
                )
            if old.compile_only != self.config.compile_only:
                raise CampaignError(
                    f"{self.store.root} was run with compile_only={old.compile_only}; keep that setting")
            status.config = self.config  # iterations, steps and the rest may change between runs
            status.kb_path = self.kb_path
        status.runs += 1
        status.state = "running"
        status.message = ""
        status.updated_at = utcnow()
        self.store.write_status(status)
        return status

    def _load(self) -> None:
        initials = self.store.initials()
        steps_by_problem: dict[str, list[StepRecord]] = {}
        for s in self.store.steps():
            steps_by_problem.setdefault(s.problem, []).append(s)
        for path in self.config.problems:
            try:
                problem = load_problem(path)
            except ProblemError as exc:
                raise CampaignError(str(exc)) from exc
            initial = initials.get(problem.name)
            if initial is not None and initial.problem_hash != problem.hash:
                raise CampaignError(
                    f"{path} changed since this campaign generated its first kernel; start a new campaign folder"
                )
            run = _ProblemRun(problem=problem, initial=initial, steps=steps_by_problem.get(problem.name, []))
            self._runs[problem.name] = run
            self._done[problem.name] = (initial is not None) + len(
                [s for s in run.steps if s.iteration < self.config.iterations and s.step < self.config.steps]
            )

    def _total(self) -> int:
        return 1 + self.config.iterations * self.config.steps

    def _note(self, problem: str, message: str) -> None:
        with self._events_lock:
            self._events.append((problem, self._done[problem], message))

    # -- the run -----------------------------------------------------------------------------------

    def run(self) -> CampaignReport:
        """Runs every unfinished unit, then writes best kernels and the report.

        Raises CampaignStopped when stopped early (KeyboardInterrupt in the caller's thread stops
        the campaign after the steps in flight, and is re-raised).
        """
        self.store.acquire()
        try:
            status = self._open()
            self._load()
            self.store.write_kb_start(self.bench.snapshot())
            if self.config.gradient_every == 0:
                self.log("textual gradient off (--gradient-every 0): the KB is updated numerically only")
            for name in self._runs:
                self.progress(name, self._done[name], self._total(), "resumed" if self._done[name] else "queued")
            try:
                failure = self._execute()
            except BaseException as exc:  # record it quickly; the report can wait for the rerun
                if isinstance(exc, Exception):
                    self._set_status(status, "failed", f"failed: {type(exc).__name__}: {exc}")
                else:  # KeyboardInterrupt, or a job's cancellation
                    self._set_status(status, "stopped", f"interrupted ({type(exc).__name__})")
                raise
            write_best_kernels(self.store, self.config.problems)
            report = self.report()
            write_report(report, self.store.report_dir)
            if failure is not None or self.stop.is_set():
                message = str(failure) if failure else "stopped on request"
                self._set_status(status, "stopped", message)
                raise CampaignStopped(f"{message}; rerun the same command to resume from {self.store.root}")
            self._set_status(status, "finished", "")
            return report
        finally:
            self.store.release()

    def _set_status(self, status: CampaignStatus, state: str, message: str) -> None:
        status.state = state  # type: ignore[assignment]
        status.message = message
        status.updated_at = utcnow()
        self.store.write_status(status)

    def _execute(self) -> BaseException | None:
        """Runs trajectories on a thread pool; returns the error that stopped it, if any.

        A first KeyboardInterrupt (or a job's cancellation, raised by `progress`) stops the
        campaign after the steps in flight and is re-raised then; a second one is re-raised at
        once (the caller exits; every file on disk is whole either way).
        """
        failure: BaseException | None = None
        interrupt: BaseException | None = None
        pool = ThreadPoolExecutor(max_workers=self.config.parallel, thread_name_prefix="kb-mcp-rollout")
        pending: set[Future[None]] = {
            pool.submit(self._trajectory, run,
                        it) for run in self._runs.values() for it in range(self.config.iterations)
        }
        while pending:
            try:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                if interrupt is None:  # once stopping, progress sinks are not called again (a
                    self._flush_events()  # cancelled job's would raise once more)
            except BaseException as exc:
                if interrupt is not None:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise CampaignAborted(
                        "interrupted twice: quitting without waiting for the steps in flight") from exc
                interrupt = exc
                self.stop.set()
                self.log("stopping after the steps in flight (interrupt again to quit at once)")
                continue
            for fut in done:
                raised = fut.exception()
                if raised is not None and failure is None:
                    failure = raised
                    self.stop.set()
        pool.shutdown(wait=True)
        if interrupt is not None:
            raise interrupt
        self._flush_events()
        if failure is not None and not isinstance(failure, (LLMError, CampaignStopped)):
            raise failure
        return failure

    def _flush_events(self) -> None:
        with self._events_lock:
            events, self._events = self._events, []
        for problem, done, message in events:
            self.progress(problem, done, self._total(), message)

    # -- units -------------------------------------------------------------------------------------

    def _trajectory(self, run: _ProblemRun, iteration: int) -> None:
        if self.stop.is_set():
            return
        with run.lock:  # the first trajectory of a problem generates its initial kernel; the others wait
            if run.initial is None:
                run.initial = self._generate(run)
        if not run.initial.accepted or run.initial.candidate_id is None:
            return
        for step in range(self.config.steps):
            if self.stop.is_set():
                return
            with run.lock:
                done = {(s.iteration, s.step) for s in run.steps}
                if (iteration, step) in done:
                    continue
                current = self._current(run, iteration)
                tried = [
                    s.optimization_id
                    for s in run.steps
                    if s.iteration == iteration and s.parent_candidate_id == current.candidate_id and s.optimization_id
                ]
            record = self._step(run, iteration, step, current, tried)
            with run.lock:
                run.steps.append(record)
            self.store.write_step(record)
            with self._events_lock:
                self._done[run.name] += 1
            self._note(run.name, record.headline())
            if record.outcome_recorded:
                self._maybe_gradient()

    def _current(self, run: _ProblemRun, iteration: int) -> _Kernel:
        """The kernel a trajectory continues from.

        Each step starts from the trajectory's current kernel and replaces it only when accepted,
        so the current kernel after the last finished step is its candidate if accepted, else
        its parent. A trajectory without steps starts from the problem's best kernel so far.
        """
        mine = sorted((s for s in run.steps if s.iteration == iteration), key=lambda s: s.step)
        if mine:
            last = mine[-1]
            if last.accepted and last.candidate_id and last.final is not None:
                cid, time_ms = last.candidate_id, last.final.record.time_ms
            else:
                cid, time_ms = last.parent_candidate_id, last.parent_time_ms
            return _Kernel(cid, self.store.kernel_source(run.name, cid), time_ms)
        best = pick_best(run.initial, run.steps)
        assert best is not None  # the trajectory runs only after an accepted initial kernel
        return _Kernel(best.candidate_id, self.store.kernel_source(run.name, best.candidate_id), best.time_ms)

    def _verify(self, run: _ProblemRun, source: str) -> AttemptRecord:
        started = time.monotonic()
        attempt = self.bench.verify(run.problem, source, compile_only=self.config.compile_only)
        attempt.wall_s = round(time.monotonic() - started, 3)
        self.store.save_kernel(run.name, attempt.candidate_id, source)
        if attempt.verdict == Verdict.needs_gpu and not self.config.compile_only:
            raise CampaignStopped(
                "the harness found no GPU to verify on (verdict needs_gpu); run on a GPU machine or pass --compile-only"
            )
        return attempt

    def _fix_loop(
        self,
        run: _ProblemRun,
        unit: UnitRecord,
        conv: Conversation,
        answer: KernelAnswer,
        attempts: int,
        parse: Callable[[str], KernelAnswer] = parse_kernel_answer,
    ) -> KernelAnswer:
        """Verifies `answer`, has a usable candidate reviewed, and asks for fixes on the harness's (or
        the review's) messages, up to `attempts` candidates.

        Returns the last answer (the one whose candidate is `unit.final`). A flagged result (an
        implausible speedup held for review) ends the loop: it is not wrong, so there is nothing to fix.
        A review that gave no usable answer ends it too (the candidate is then not accepted).
        """
        for n in range(1, attempts + 1):
            try:
                attempt = self._verify(run, answer.source)
            except BenchError as exc:
                unit.error = str(exc)
                return answer
            unit.attempts.append(attempt)
            if _usable_now(attempt, self.config.compile_only):
                if not self.config.review:
                    return answer
                attempt.review = self._review(run, unit, answer.source)
                if attempt.review.accepted or attempt.review.error or n == attempts:
                    return answer
                message = review_fix_request(attempt.review.issues, n, attempts)
            elif attempt.record.flagged or n == attempts:
                return answer
            else:
                message = fix_request(attempt.verdict.value, attempt.feedback, n, attempts)
            try:
                answer = conv.ask(message, parse)
            except AgentFailed as exc:
                unit.error = str(exc)
                return answer
        return answer

    def _review(self, run: _ProblemRun, unit: UnitRecord, source: str) -> ReviewRecord:
        conv = Conversation(
            self.llm, Role.review, REVIEW_SYSTEM, problem=run.name, ledger=unit.tokens,
            answer_retries=self.config.answer_retries
        )
        try:
            answer = conv.ask(review_request(run.name, run.problem.source, source), parse_review)
        except AgentFailed as exc:
            # Without a usable review the result is not accepted: acceptance requires the review.
            return ReviewRecord(accepted=False, error=str(exc))
        return ReviewRecord(accepted=answer.accepted, issues=answer.issues, summary=answer.summary)

    def _finish_unit(self, unit: UnitRecord) -> None:
        final = unit.final
        if final is None:
            return
        unit.review = final.review  # the review of the final candidate (earlier ones are on their attempts)

    def _generate(self, run: _ProblemRun) -> InitialRecord:
        started = time.monotonic()
        record = InitialRecord(problem=run.name, problem_hash=run.problem.hash, problem_path=run.problem.path or "")
        self._note(run.name, "generating the first kernel")
        conv = Conversation(
            self.llm, Role.generate, GENERATE_SYSTEM, problem=run.name, ledger=record.tokens,
            answer_retries=self.config.answer_retries,
        )
        try:
            answer = conv.ask(generate_request(run.name, run.problem.source), parse_kernel_answer)
        except AgentFailed as exc:
            record.error = str(exc)
        else:
            self._fix_loop(run, record, conv, answer, self.config.generate_attempts)
            self._finish_unit(record)
        final = record.final
        record.accepted = (
            final is not None
            and _usable_now(final, self.config.compile_only)
            and (record.review is None or record.review.accepted)
        )
        record.kb = self.bench.snapshot()
        record.wall_s = round(time.monotonic() - started, 3)
        record.finished_at = utcnow()
        self.store.write_initial(record)
        with self._events_lock:
            self._done[run.name] += 1
        verdict = final.verdict.value if final else "no candidate"
        self._note(run.name, f"first kernel: {verdict}{'' if record.accepted else ' (not usable)'}")
        return record

    def _step(self, run: _ProblemRun, iteration: int, step: int, current: _Kernel, tried: list[str]) -> StepRecord:
        started = time.monotonic()
        record = StepRecord(
            problem=run.name, iteration=iteration, step=step,
            parent_candidate_id=current.candidate_id, parent_time_ms=current.time_ms,
        )
        with run.lock:  # a profile of this kernel taken when it was accepted is reused, not retaken
            known = next(
                (s.next_profile_id for s in run.steps if s.candidate_id == current.candidate_id and s.next_profile_id),
                None,
            )
        try:
            diagnosis = self._diagnose(run, current.source, current.candidate_id, known)
            record.profile_id = diagnosis.profile_id
            record.state_id = diagnosis.state_id
            record.state_source = diagnosis.state_source
            offers = self.bench.suggest(
                diagnosis.state_id, k=self.config.top_k, temperature=self.config.temperature,
                exclude=[*tried, *diagnosis.ruled_out],
                seed=_seed(self.config.seed, run.name, iteration, step), candidate_id=current.candidate_id,
            )
        except BenchError as exc:
            record.error = str(exc)
            return self._close_step(record, started)
        if not offers:
            record.error = f"no untried optimization applies in state {diagnosis.state_id}"
            return self._close_step(record, started)
        record.suggestions = [o.suggestion for o in offers]
        pick = offers[0]  # already drawn by weight: the first draw is this step's choice
        record.optimization_id = pick.suggestion.optimization_id
        record.predicted_speedup = pick.suggestion.expected_speedup
        conv = Conversation(
            self.llm, Role.lower, LOWER_SYSTEM, problem=run.name, ledger=record.tokens,
            answer_retries=self.config.answer_retries,
        )
        summary = "compile-only run: not timed" if current.time_ms is None else f"{current.time_ms:.4g} ms"
        parse_changed = changed_kernel_parser(current.source)
        try:
            answer = conv.ask(
                lower_request(
                    problem_name=run.name,
                    reference_source=run.problem.source,
                    current_source=current.source,
                    current_summary=summary,
                    state_summary=diagnosis.state_summary,
                    profile_summary=diagnosis.profile_summary,
                    optimization_summary=pick.prompt,
                ),
                parse_changed,
            )
        except AgentFailed as exc:
            record.error = str(exc)
            return self._close_step(record, started)
        answer = self._fix_loop(run, record, conv, answer, self.config.fix_attempts, parse_changed)
        self._finish_unit(record)
        if record.final is None:  # the harness could not check even one candidate (the error says why)
            return self._close_step(record, started)
        self._judge(run, record, current)
        self._record_outcome(record, answer)
        return self._close_step(record, started)

    def _judge(self, run: _ProblemRun, record: StepRecord, current: _Kernel) -> None:
        """Whether the step's final candidate moves the trajectory on, and the state it reaches."""
        final = record.final
        assert final is not None
        reviewed_ok = record.review is None or record.review.accepted
        if final.verdict.is_valid and final.record.time_ms and current.time_ms:
            record.speedup_vs_parent = current.time_ms / final.record.time_ms
        if self.config.compile_only:
            record.accepted = _usable_now(final, True) and reviewed_ok
        else:
            faster = record.speedup_vs_parent is not None and record.speedup_vs_parent > 1.0
            record.accepted = _usable_now(final, False) and reviewed_ok and faster
        if record.accepted and not self.config.compile_only:
            # Classify the new kernel now: the transition (state, optimization -> next state) is
            # recorded with the outcome, and the next step of the trajectory reuses this profile.
            try:
                after = self._diagnose(run, self.store.kernel_source(run.name, final.candidate_id), final.candidate_id,
                                       None)
            except BenchError as exc:
                record.outcome_note = f"next state unknown: {exc}; "
            else:
                if after.state_source == "classified":
                    record.next_state_id, record.next_profile_id = after.state_id, after.profile_id

    def _record_outcome(self, record: StepRecord, answer: KernelAnswer) -> None:
        """Records the step's outcome in the KB through record_outcome, unless the review rejected it."""
        if record.review is not None and not record.review.accepted:
            # The harness's verdict stands, but a result the review rejects must not earn the
            # optimization credit: it is kept out of the KB's statistics.
            record.outcome_note += "not recorded: the review found dropped functionality"
        else:
            try:
                recorded, note = self.bench.record(
                    record, analysis=self._analysis(record, answer), next_state_id=record.next_state_id
                )
            except BenchError as exc:
                recorded, note = False, f"not recorded: {exc}"
            record.outcome_recorded = recorded
            record.outcome_note += note

    def _diagnose(self, run: _ProblemRun, source: str, candidate_id: str, profile_id: str | None) -> KernelDiagnosis:
        return self.bench.diagnose(
            run.problem, source, candidate_id, compile_only=self.config.compile_only,
            fallback_state=self.config.fallback_state, profile_id=profile_id,
        )

    def _analysis(self, record: StepRecord, answer: KernelAnswer) -> str:
        """The text kept with the outcome in the KB: what the harness and the review said."""
        final = record.final
        parts = []
        if answer.note:
            parts.append(f"lowering note: {answer.note}")
        if final is not None and final.feedback:
            parts.append(f"harness: {final.feedback[:600]}")
        if len(record.attempts) > 1:
            parts.append(f"{len(record.attempts)} candidates (fixes after "
                         f"{', '.join(a.verdict.value for a in record.attempts[:-1])})")
        if record.review is not None and record.review.issues:
            parts.append("review: " + "; ".join(record.review.issues)[:400])
        return " | ".join(parts)

    def _close_step(self, record: StepRecord, started: float) -> StepRecord:
        record.kb = self.bench.snapshot()
        record.wall_s = round(time.monotonic() - started, 3)
        record.finished_at = utcnow()
        return record

    # -- textual gradient --------------------------------------------------------------------------

    def _maybe_gradient(self) -> None:
        every = self.config.gradient_every
        if every <= 0 or not self._gradient_lock.acquire(blocking=False):
            return
        try:
            gradients = self.store.gradients()
            used = {key for g in gradients for key in g.step_keys}
            with_outcome = sorted(
                (s for run in self._runs.values() for s in list(run.steps) if s.outcome_recorded and s.key not in used),
                key=lambda s: s.finished_at,
            )
            while len(with_outcome) >= every and not self.stop.is_set():
                batch, with_outcome = with_outcome[:every], with_outcome[every:]
                index = len(gradients) + 1
                self._note(batch[-1].problem, f"textual gradient {index} over {len(batch)} outcomes")
                record = self.bench.gradient(self.llm, batch, index=index, answer_retries=self.config.answer_retries)
                self.store.write_gradient(record)
                gradients.append(record)
                self._note(
                    batch[-1].problem,
                    f"textual gradient {index}: {len(record.applied)} edits applied, {len(record.rejected)} rejected"
                    + (f" ({record.error[:60]})" if record.error else ""),
                )
        finally:
            self._gradient_lock.release()

    # -- results -----------------------------------------------------------------------------------

    def report(self) -> CampaignReport:
        """The report from the raw records on disk."""
        return build_report(
            self.config,
            self.store.initials(),
            self.store.steps(),
            self.store.gradients(),
            self.store.kb_start(),
            [problem_name(p) for p in self.config.problems],
            self.store.retried(),
        )
