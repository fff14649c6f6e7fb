"""The units of a campaign (`campaign.loop`): a problem's first kernel (generated, verified and fixed,
reviewed) and one rollout step (the current kernel diagnosed, an optimization drawn from the KB and
lowered, the candidate verified and fixed, reviewed, judged, and its outcome recorded in the KB).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
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
from kb_mcp.campaign.models import AttemptRecord, CampaignConfig, InitialRecord, ReviewRecord, StepRecord, UnitRecord
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.clients.llm import LLMClient, Role
from kb_mcp.harness.problem import Problem
from kb_mcp.kb.models import Verdict, utcnow

__all__ = ["CampaignStopped", "Kernel", "ProblemRun", "Units", "usable_now"]


class CampaignStopped(Exception):
    """The campaign stopped before finishing (stop requested, or the LLM endpoint failed); rerun to resume."""


@dataclass
class Kernel:
    """A kernel a trajectory continues from: its candidate, source and time (None: not timed)."""

    candidate_id: str
    source: str
    time_ms: float | None


@dataclass
class ProblemRun:
    """One problem of a campaign: its first kernel and the steps taken so far (guarded by `lock`)."""

    problem: Problem
    initial: InitialRecord | None
    steps: list[StepRecord] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.problem.name


def usable_now(attempt: AttemptRecord, compile_only: bool) -> bool:
    """Whether a candidate may go on (review, acceptance): correct and timed, or compiled when no GPU."""
    if compile_only:
        return attempt.verdict == Verdict.needs_gpu or (attempt.verdict.is_valid and not attempt.record.flagged)
    return attempt.verdict.is_valid and not attempt.record.flagged and attempt.record.time_ms is not None


def unit_seed(*parts: object) -> int:
    """A step's seed for drawing optimizations, the same on every rerun of the campaign."""
    digest = hashlib.sha256("\0".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


class Units:
    """The units of one campaign on its settings, bench, LLM and store; `note(problem, message)` tells
    the campaign's progress what a unit is doing."""

    def __init__(self, config: CampaignConfig, store: CampaignStore, bench: Bench, llm: LLMClient,
                 note: Callable[[str, str], None]) -> None:
        self.config = config
        self.store = store
        self.bench = bench
        self.llm = llm
        self.note = note

    def _verify(self, run: ProblemRun, source: str) -> AttemptRecord:
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
        run: ProblemRun,
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
            if usable_now(attempt, self.config.compile_only):
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

    def _review(self, run: ProblemRun, unit: UnitRecord, source: str) -> ReviewRecord:
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

    def generate(self, run: ProblemRun) -> InitialRecord:
        """The problem's first kernel: generated, verified and fixed, reviewed; the record of the unit."""
        started = time.monotonic()
        record = InitialRecord(problem=run.name, problem_hash=run.problem.hash, problem_path=run.problem.path or "")
        self.note(run.name, "generating the first kernel")
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
            and usable_now(final, self.config.compile_only)
            and (record.review is None or record.review.accepted)
        )
        record.kb = self.bench.snapshot()
        record.wall_s = round(time.monotonic() - started, 3)
        record.finished_at = utcnow()
        return record

    def step(self, run: ProblemRun, iteration: int, step: int, current: Kernel, tried: list[str]) -> StepRecord:
        """One rollout step from `current` (optimizations `tried` already left out): the record of the unit."""
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
                seed=unit_seed(self.config.seed, run.name, iteration, step), candidate_id=current.candidate_id,
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

    def _judge(self, run: ProblemRun, record: StepRecord, current: Kernel) -> None:
        """Whether the step's final candidate moves the trajectory on, and the state it reaches."""
        final = record.final
        assert final is not None
        reviewed_ok = record.review is None or record.review.accepted
        if final.verdict.is_valid and final.record.time_ms and current.time_ms:
            record.speedup_vs_parent = current.time_ms / final.record.time_ms
        if self.config.compile_only:
            record.accepted = usable_now(final, True) and reviewed_ok
        else:
            faster = record.speedup_vs_parent is not None and record.speedup_vs_parent > 1.0
            record.accepted = usable_now(final, False) and reviewed_ok and faster
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

    def _diagnose(self, run: ProblemRun, source: str, candidate_id: str, profile_id: str | None) -> KernelDiagnosis:
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
