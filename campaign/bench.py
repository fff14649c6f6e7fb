"""The campaign's lab bench: the five tool functions, called the way an MCP agent would call them.

A campaign is an agent that lives inside the server: it profiles with `profile_kernel`, classifies
with `classify_state`, selects with `suggest_optimizations`, verifies with `compile_and_verify` and
learns through `record_outcome`, so its outcomes enter the KB through exactly the same checks as
any other agent's. This module adapts those tools' requests and results to the campaign's records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.campaign.cluster_models import ClusterError
from kb_mcp.campaign.models import AttemptRecord, GradientRecord, KBSnapshot, StepRecord, SuggestionRecord
from kb_mcp.campaign.textual_gradient import run_textual_gradient
from kb_mcp.clients.llm import LLMClient
from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.problem import Problem
from kb_mcp.kb import ids
from kb_mcp.kb.arch import arch_family
from kb_mcp.kb.models import DEFAULT_TRACK, Outcome, Track, Verdict
from kb_mcp.kb.provenance import quote
from kb_mcp.policy.structure import reference_structure
from kb_mcp.profiling.profile_store import ProfileNotFound, ProfileStore
from kb_mcp.tools import classify_state, compile_and_verify, profile_kernel, record_outcome, suggest_optimizations
from kb_mcp.tools.base import ToolError
from kb_mcp.tools.context import ToolContext
from kb_mcp.tools.profile_kernel import KernelSummary

MAX_FEEDBACK = 4000  # characters of harness messages sent back to the model per attempt


class BenchError(RuntimeError):
    """A tool refused or failed; the message is the tool's own (actionable) message."""


class KernelDiagnosis(BaseModel):
    """What profiling and classification said about the current kernel."""

    model_config = ConfigDict(extra="forbid")

    state_id: str
    state_source: Literal["classified", "fallback"]
    profile_id: str | None = None
    state_summary: str
    profile_summary: str = ""
    ruled_out: list[str] = Field(default_factory=list)  # optimizations the reference's structure excludes (fallback)


class Offer(BaseModel):
    """One optimization drawn for a step, with the text the lowering prompt shows."""

    model_config = ConfigDict(extra="forbid")

    suggestion: SuggestionRecord
    prompt: str


Verifier = Callable[[compile_and_verify.Request], compile_and_verify.Result]
"""How the bench verifies a candidate: `compile_and_verify` on this process's pool, or on a cluster's
workers (`campaign.cluster.verify_on`), its verdict stored here either way."""


class Bench:
    """The tools, bound to one ToolContext (one KB, one harness worker pool, or `verifier` for the
    verifications)."""

    def __init__(self, ctx: ToolContext, *, arch: str | None = None, track: Track = DEFAULT_TRACK,
                 verifier: Verifier | None = None) -> None:
        self.ctx = ctx
        self.verifier: Verifier = verifier or (lambda request: compile_and_verify.run(ctx, request))
        self.arch = arch
        self.track = track  # every candidate is verified, and every suggestion drawn, in this precision track
        self._arch_seen: str | None = None  # the arch the harness reported, once a candidate ran
        # Parallel trajectories overlap their LLM work but take turns on the GPU: the GPU tools
        # hold the GPU lane, shared with every client of this server and every kb-mcp process
        # measuring on the same GPU.

    @property
    def arch_hint(self) -> str | None:
        """The arch to score under: the configured one, else what the harness reported."""
        return self.arch or self._arch_seen

    # -- KB ---------------------------------------------------------------------------------------

    def snapshot(self) -> KBSnapshot:
        """The KB's size now."""
        store = self.ctx.store
        stats = store.stats()
        with store.read() as view:
            deprecated = sum(1 for o in view.list_optimizations() if o.deprecated)
        size = sum(p.stat().st_size for p in (store.path, store.journal_path) if p.exists())
        return KBSnapshot(
            states=sum(stats.states.values()),
            discovered_states=stats.states.get("discovered", 0),
            optimizations=sum(stats.optimizations.values()),
            deprecated_optimizations=deprecated,
            lessons=stats.lessons,
            outcomes=sum(stats.outcomes.values()),
            measured_scores=stats.measured_scores,
            bytes=size,
        )

    def suggest(
        self, state_id: str, *, k: int, temperature: float, exclude: Sequence[str], seed: int,
        candidate_id: str | None = None
    ) -> list[Offer]:
        """The KB's k best suggestions for `state_id` (best first), leaving out what the lineage of
        `candidate_id` already applied."""
        if candidate_id is not None and self.ctx.store.get_candidate(candidate_id) is None:
            candidate_id = None  # a kernel the KB has no verdict on has no lineage there either
        request = suggest_optimizations.Request(
            state_id=state_id, k=min(k, 10), temperature=min(temperature, 5.0), arch=self.arch_hint,
            exclude=list(exclude), seed=seed, candidate_id=candidate_id, track=self.track,
        )
        try:
            result = suggest_optimizations.run(self.ctx, request)
        except ToolError as exc:
            raise BenchError(f"suggest_optimizations: {exc}") from exc
        offers = []
        for s in result.suggestions:
            agent_made = s.recorded_by is not None
            text = [("What to do", s.what_to_do), ("Why it fits", s.why_it_fits), ("Cost and risks", s.cost)]
            lines = [f"{s.name} (id {s.id}, category {s.category})"]
            for label, value in text:
                if not value:
                    continue
                if agent_made:  # another agent's words: quoted as data, with where they came from
                    value = quote(value, author=s.recorded_by or "", source=s.origin, outcome_id=s.from_outcome)
                lines.append(f"{label}: {value}")
            lines.append(
                f"Expected speedup x{s.expected_speedup:.2f} (confidence {s.confidence:.2f}, {s.samples} measured, "
                f"{s.failures} failed of {s.attempts} attempts)"
            )
            lines += [
                "Lesson: " + quote(x.text, author=x.author, source=x.source, outcome_id=x.outcome_id) for x in s.lessons
            ]
            if agent_made or s.lessons:
                lines.append(f"({result.kb_text_notice})")
            offers.append(
                Offer(
                    suggestion=SuggestionRecord(optimization_id=s.id, expected_speedup=s.expected_speedup,
                                                confidence=s.confidence),
                    prompt="\n".join(lines),
                )
            )
        return offers

    def record(self, step: StepRecord, *, analysis: str, next_state_id: str | None = None) -> tuple[bool, str]:
        """Records the step's final candidate through `record_outcome`; returns (recorded, note)."""
        if step.candidate_id is None or step.state_id is None or step.optimization_id is None:
            return False, "nothing to record"
        request = record_outcome.Request(
            state_id=step.state_id,
            optimization_id=step.optimization_id,
            candidate_id=step.candidate_id,
            parent_candidate_id=step.parent_candidate_id,
            next_state_id=next_state_id,
            analysis=analysis[: record_outcome.MAX_TEXT],
            tokens=step.tokens.total.total,
        )
        try:
            result = record_outcome.run(self.ctx, request)
        except ToolError as exc:
            raise BenchError(f"record_outcome: {exc}") from exc
        # Outcomes are idempotent per (candidate, optimization): a step redone after a crash that
        # produced the same candidate finds its outcome already there, which is still "recorded".
        return True, result.note

    def outcome_of(self, step: StepRecord) -> Outcome | None:
        """The replay-buffer entry a recorded step produced."""
        if step.candidate_id is None or step.optimization_id is None:
            return None
        return self.ctx.store.get_outcome(ids.outcome_id(step.candidate_id, step.optimization_id))

    def gradient(self, llm: LLMClient, batch: Sequence[StepRecord], *, index: int,
                 answer_retries: int) -> GradientRecord:
        """One textual-gradient update over the outcomes of `batch`, applied to the KB."""
        outcomes = [o for o in (self.outcome_of(s) for s in batch) if o is not None]
        predicted = {
            (s.state_id, s.optimization_id): s.predicted_speedup
            for s in batch
            if s.state_id is not None and s.optimization_id is not None
        }
        before = self.snapshot()
        record = run_textual_gradient(
            llm,
            self.ctx.store,
            outcomes,
            predicted,
            index=index,
            step_keys=[s.key for s in batch],
            arch=arch_family(self.arch_hint),  # scores are kept per family (sm_90 -> hopper)
            answer_retries=answer_retries,
        )
        record.kb_before = before
        record.kb_after = self.snapshot()
        return record

    # -- harness ------------------------------------------------------------------------------------

    def verify(self, problem: Problem, source: str, *, compile_only: bool) -> AttemptRecord:
        """Compiles, verifies and times one candidate through `compile_and_verify` (which stores the
        server's verdict in the KB, the only thing `record_outcome` will credit)."""
        request = compile_and_verify.Request(
            problem=problem.path or problem.source,
            candidate=source,
            options=VerifyOptions(compile_only=compile_only, track=self.track),
            detail=True,  # per-set errors and full compiler logs feed the fix loop
        )
        try:
            result = self.verifier(request)
        except ToolError as exc:
            raise BenchError(f"compile_and_verify: {exc}") from exc
        except ClusterError as exc:
            raise BenchError(f"compile_and_verify on the cluster: {exc}") from exc
        if result.record.arch and result.record.device:
            self._arch_seen = result.record.arch
        return attempt_from(result)

    def diagnose(
        self,
        problem: Problem,
        source: str,
        candidate_id: str,
        *,
        compile_only: bool,
        fallback_state: str | None,
        profile_id: str | None = None,
    ) -> KernelDiagnosis:
        """Profiles the kernel (or reuses `profile_id`), classifies it, and says which state it is in.

        Without a profile (compile-only runs, no GPU) the state is `fallback_state`, or where that is
        None the one the reference's operations point to, and the diagnosis says so.
        """
        if compile_only:
            return self._fallback(problem, fallback_state, "compile-only run: no GPU profile, so no measured state")
        try:
            if profile_id is None:
                profiled = profile_kernel.run(
                    self.ctx, profile_kernel.Request(problem=problem.path or problem.source, candidate=source)
                )
                if profiled.profile_id is None:  # needs_gpu: no GPU to profile on
                    return self._fallback(problem, fallback_state, profiled.summary)
                profile_id, kernels, notes = profiled.profile_id, profiled.kernels, profiled.notes
                if not profiled.counters_available:
                    notes = [*notes, f"no hardware counters: {profiled.counters_reason}"]
            else:
                stored = ProfileStore(self.ctx.profiles_dir).load(profile_id)
                kernels, _ = profile_kernel.summarize(stored, detail=False, top=8)
                notes = [] if stored.counters_available else [f"no hardware counters: {stored.counters_reason}"]
            classified = classify_state.run(self.ctx, classify_state.Request(profile_id=profile_id))
        except (ToolError, ProfileNotFound) as exc:
            raise BenchError(f"profiling or classification failed: {exc}") from exc
        profile_text = _profile_text(kernels, notes)
        target = classified.overall if classified.overall and classified.overall.state_id else None
        if target is None:
            target = next((k for k in classified.kernels if k.state_id), None)
        if target is None or target.state_id is None:
            diagnosis = self._fallback(problem, fallback_state,
                                       "the profile matched no state (" + classified.basis + ")")
            return diagnosis.model_copy(update={"profile_id": profile_id, "profile_summary": profile_text})
        evidence = "; ".join(
            f"{e.metric}={e.value:.4g}" + (f" {e.relation} {e.threshold:.4g}" if e.threshold is not None else "")
            for e in target.evidence[:6]
        )
        state = self.ctx.store.get_state(target.state_id)
        lines = [
            f"{target.state_name} (id {target.state_id}): bottleneck {target.primary}/{target.secondary}, "
            f"confidence {target.confidence:.2f}, for "
            f"{'the whole candidate' if target.index < 0 else 'kernel ' + target.name}",
        ]
        if state is not None:
            lines.append(state.description)
        if evidence:
            lines.append(f"Evidence: {evidence}")
        if target.note:
            lines.append(target.note)
        return KernelDiagnosis(
            state_id=target.state_id,
            state_source="classified",
            profile_id=profile_id,
            state_summary="\n".join(lines),
            profile_summary=profile_text,
        )

    def _fallback(self, problem: Problem, configured: str | None, why: str) -> KernelDiagnosis:
        """The state to work in without a measured one: the configured state, else the one the
        reference's operations point to; optimizations its structure rules out are set aside."""
        structure = reference_structure(problem.source)
        state_id = configured or structure.state_id
        state = self.ctx.store.get_state(state_id)
        if state is None:
            raise BenchError(f"fallback state {state_id!r} is not in the KB")
        basis = "configured fallback state" if configured else f"{structure.describe()}, so it most likely sits here"
        return KernelDiagnosis(
            state_id=state_id,
            state_source="fallback",
            state_summary=f"{state.name} (id {state.id}), assumed: {why}; {basis}.\n{state.description}",
            ruled_out=structure.ruled_out(),
        )


def feedback(result: compile_and_verify.Result) -> str:
    """What the harness said about a candidate, as the model should read it to fix the cause."""
    lines = [result.summary]
    lines += [f"compiler: {m}" for m in result.compile.messages]
    for unit in result.compile_detail.units if result.compile_detail else []:
        if not unit.ok and unit.log:
            lines.append(f"compiler log of {unit.name}:\n{unit.log[-1500:]}")
    for check in result.input_sets or []:
        if not check.passed:
            errs = ", ".join(
                f"{label} {value:.3g}"
                for label, value in (("max abs err", check.max_abs_err), ("max rel err", check.max_rel_err))
                if value is not None
            )
            lines.append(
                f"input set {check.index} ({check.kind}): {check.mismatched}/{check.numel} elements wrong"
                + (f", {errs}" if errs else "")
                + (f": {check.message}" if check.message else "")
            )
    lines += [f"integrity {f.code.value}: {f.message}" for f in result.findings]
    verdict = result.record.verdict
    if result.output.strip() and not verdict.is_valid and verdict != Verdict.needs_gpu:
        lines.append("candidate output (tail):\n" + result.output.strip()[-800:])
    text = "\n".join(lines)
    return text if len(text) <= MAX_FEEDBACK else text[: MAX_FEEDBACK - 20] + "\n... (truncated)"


def attempt_from(result: compile_and_verify.Result) -> AttemptRecord:
    """The campaign's record of one verification: the stored record itself, and the feedback."""
    return AttemptRecord(record=result.record, feedback=feedback(result))


def _profile_text(kernels: Sequence[KernelSummary], notes: Sequence[str]) -> str:
    """The heaviest kernels' numbers, one line each, for the lowering prompt."""
    lines = []
    for k in kernels:
        parts = [
            f"{k.name} grid={k.grid} block={k.block}",
            f"{k.duration_us} us ({k.time_share:.0%} of GPU time)",
        ]
        for label, attr in (
            ("SM", "sm_throughput_pct"),
            ("memory", "memory_throughput_pct"),
            ("DRAM", "dram_throughput_pct"),
            ("occupancy", "achieved_occupancy_pct"),
        ):
            value = getattr(k, attr)
            if value is not None:
                parts.append(f"{label} {value:.0f}%")
        if k.occupancy_limiter:
            parts.append(f"occupancy limited by {k.occupancy_limiter}")
        if k.registers_per_thread:
            parts.append(f"{k.registers_per_thread:.0f} registers/thread")
        if k.top_stalls:
            parts.append("stalls " + ", ".join(f"{r} {v:.2g}" for r, v in k.top_stalls.items()))
        lines.append("- " + "; ".join(parts))
        for f in k.findings:
            gain = f" (est. {f.estimated_speedup_pct:.0f}%)" if f.estimated_speedup_pct else ""
            lines.append(f"    profiler {f.rule}{gain}: {f.message}")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)
