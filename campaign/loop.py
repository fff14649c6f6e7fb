"""The autonomous campaign loop: problems x iterations x rollout steps, resumable.

For each problem: generate a first CUDA kernel (with a compile/verify fix loop), then run
`iterations` rollout trajectories of `steps` steps. Each step profiles the trajectory's current
kernel, classifies its state, samples optimizations from the KB by weighted top-k, has the
lowering agent apply one, verifies it (fixing up to N times on compiler and verifier messages),
has it reviewed, records the outcome in the KB (numeric update), and moves the trajectory on when
the new kernel is faster. Every U recorded outcomes the textual gradient edits the KB.

Every finished unit is written as one raw record (`campaign.store`) before the next starts,
so a rerun with the same folder continues where the last run stopped, and the report and best
kernels are recomputed from those records. Trajectories run in parallel threads (`parallel`); each
unit is `campaign.units`'.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from kb_mcp.campaign.bench import Bench
from kb_mcp.campaign.best import write_best_kernels
from kb_mcp.campaign.models import (
    CampaignConfig,
    CampaignStatus,
    InitialRecord,
    StepRecord,
    problem_name,
)
from kb_mcp.campaign.owners import may_run
from kb_mcp.campaign.report import CampaignReport, build_report, pick_best
from kb_mcp.campaign.report_render import write_report
from kb_mcp.campaign.store import CampaignError, CampaignStore
from kb_mcp.campaign.units import CampaignStopped, Kernel, ProblemRun, Units
from kb_mcp.clients.llm import LLMClient, LLMError
from kb_mcp.harness.problem import ProblemError, load_problem
from kb_mcp.kb.models import utcnow

ProblemProgress = Callable[[str, int, int, str], None]
"""progress(problem, units done, units total, message): per-problem progress (the console draws a bar per
problem; a job folds it into one `kb.progress.Progress`); called from the thread that runs `run`."""


def _quiet(problem: str, done: int, total: int, message: str) -> None:
    pass


class CampaignAborted(KeyboardInterrupt):
    """A second interrupt: the campaign returns at once while steps may still be in flight in other
    threads. Nothing on disk is half-written, but the harness may still be busy: exit the process."""



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
        client: str | None = None,
    ) -> None:
        self.config = config
        self.client = client  # the server client running it (campaign.owners); None: the shell
        self.store = store
        self.bench = bench
        self.llm = llm
        self.kb_path = kb_path
        self.progress = progress
        self.log = log
        self.stop = threading.Event()
        self._gradient_lock = threading.Lock()
        self._runs: dict[str, ProblemRun] = {}
        self._done: dict[str, int] = {}
        self._events: list[tuple[str, int, str]] = []  # (problem, done, message) from worker threads
        self._events_lock = threading.Lock()
        self.units = Units(config, store, bench, llm, self._note)

    # -- setup and resume ------------------------------------------------------------------------

    def _open(self) -> CampaignStatus:
        status = self.store.read_status()
        if status is None:
            status = CampaignStatus(config=self.config, kb_path=self.kb_path, client=self.client)
        else:
            may_run(status, self.client, self.store.root)
            old = status.config
            changes = self.config.changes_from(old)
            if old.problems != self.config.problems:
                raise CampaignError(
                    f"{self.store.root} holds a campaign over other problems ({'; '.join(changes)}); use another "
                    "folder (--name or --out), or rerun without problems to resume it"
                )
            if old.compile_only != self.config.compile_only:
                raise CampaignError(
                    f"{self.store.root} was run with compile_only={old.compile_only}; keep that setting")
            if changes:  # iterations, steps, models and the rest may change between runs: say which did
                self.log(f"resuming {self.store.root} with settings changed since its last run: {'; '.join(changes)}")
            status.config = self.config
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
            run = ProblemRun(problem=problem, initial=initial, steps=steps_by_problem.get(problem.name, []))
            self._runs[problem.name] = run
            self._done[problem.name] = (initial is not None) + len(
                [s for s in run.steps if s.iteration < self.config.iterations and s.step < self.config.steps]
            )

    def _resumed(self, run: int) -> str:
        """What a resumed run found finished, so the operator sees nothing was started over."""
        initials = sum(r.initial is not None for r in self._runs.values())
        steps = sum(self._done.values()) - initials
        gradients = len(self.store.gradients())
        return (f"resuming {self.store.root} (run {run}): kept {initials} of {len(self._runs)} first kernels, "
                f"{steps} of {len(self._runs) * (self._total() - 1)} steps and {gradients} textual-gradient "
                "batches; running the rest")

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
            try:  # from here on the header is "running": whatever ends the run says so there
                self._start(status)
                failure = self._execute()
                write_best_kernels(self.store, self.config.problems)
                report = self.report()
                write_report(report, self.store.report_dir)
            except BaseException as exc:  # record it quickly; the report can wait for the rerun
                if isinstance(exc, Exception):
                    self._set_status(status, "failed", f"failed: {type(exc).__name__}: {exc}")
                else:  # KeyboardInterrupt, or a job's cancellation
                    self._set_status(status, "stopped", f"interrupted ({type(exc).__name__})")
                raise
            if failure is not None or self.stop.is_set():
                message = str(failure) if failure else "stopped on request"
                self._set_status(status, "stopped", message)
                raise CampaignStopped(f"{message}; rerun the same command to resume from {self.store.root}")
            self._set_status(status, "finished", "")
            return report
        finally:
            self.store.release()

    def _start(self, status: CampaignStatus) -> None:
        """Reads back what earlier runs finished (a record that cannot be read stops the run) and says
        what this run starts from."""
        self._load()
        self.store.write_kb_start(self.bench.snapshot())
        if status.runs > 1:
            self.log(self._resumed(status.runs))
        if self.config.gradient_every == 0:
            self.log("textual gradient off (--gradient-every 0): the KB is updated numerically only")
        for name in self._runs:
            self.progress(name, self._done[name], self._total(), "resumed" if self._done[name] else "queued")

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
        # Each trajectory runs in a copy of this thread's context: a campaign a server runs for one of
        # its agents verifies and records as that agent (`tools.context.acting_for`), and what its
        # candidates try in the sandbox is logged with the agent's name.
        pending: set[Future[None]] = {
            pool.submit(contextvars.copy_context().run, self._trajectory, run, it)
            for run in self._runs.values() for it in range(self.config.iterations)
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
        if failure is None and not self.stop.is_set():
            # A batch whose last outcome came while another thread held the gradient, or one a
            # previous run lost (killed, or its endpoint failed, after the outcomes were recorded):
            # no step of this run may come to start it, so it is run here.
            try:
                self._maybe_gradient()
            except (LLMError, CampaignStopped) as exc:
                failure = exc
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

    def _trajectory(self, run: ProblemRun, iteration: int) -> None:
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
            record = self.units.step(run, iteration, step, current, tried)
            with run.lock:
                run.steps.append(record)
            self.store.write_step(record)
            with self._events_lock:
                self._done[run.name] += 1
            self._note(run.name, record.headline())
            if record.outcome_recorded:
                self._maybe_gradient()

    def _current(self, run: ProblemRun, iteration: int) -> Kernel:
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
            return Kernel(cid, self.store.kernel_source(run.name, cid), time_ms)
        best = pick_best(run.initial, run.steps)
        assert best is not None  # the trajectory runs only after an accepted initial kernel
        return Kernel(best.candidate_id, self.store.kernel_source(run.name, best.candidate_id), best.time_ms)

    def _generate(self, run: ProblemRun) -> InitialRecord:
        """The problem's first kernel (`Units.generate`), written before the next unit starts."""
        record = self.units.generate(run)
        self.store.write_initial(record)
        with self._events_lock:
            self._done[run.name] += 1
        final = record.final
        verdict = final.verdict.value if final else "no candidate"
        self._note(run.name, f"first kernel: {verdict}{'' if record.accepted else ' (not usable)'}")
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
