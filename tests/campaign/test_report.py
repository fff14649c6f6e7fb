"""The report is recomputed from the raw per-step records on disk, every time."""

from __future__ import annotations

import json
import math
from pathlib import Path

from kb_mcp.campaign.models import (
    AttemptRecord,
    CampaignConfig,
    CampaignStatus,
    InitialRecord,
    KBSnapshot,
    ReviewRecord,
    StepRecord,
)
from kb_mcp.campaign.report import report_from_store
from kb_mcp.campaign.report_render import PLOTS, write_report
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.clients.llm import TokenCount, TokenLedger
from kb_mcp.kb.models import Verdict

# (eager ms, torch.compile ms) per problem
BASELINES = {"pa": (2.0, 1.0), "pb": (1.0, 3.0), "pc": (None, None)}


def _attempt(problem: str, cid: str, verdict: Verdict, time_ms: float | None = None,
             flagged: bool = False) -> AttemptRecord:
    eager, compiled = BASELINES[problem]
    timed = verdict.is_valid
    return AttemptRecord(
        candidate_id=cid,
        verdict=verdict,
        time_ms=time_ms if timed else None,
        eager_ms=eager if timed else None,
        compile_ms=compiled if timed else None,
        flagged=flagged,
    )


def _tokens(role: str, problem: str, n: int) -> TokenLedger:
    ledger = TokenLedger()
    ledger.record(role, problem, TokenCount(calls=1, prompt_tokens=n, completion_tokens=n // 2))
    return ledger


def _step(problem, it, st, cid, verdict, time_ms=None, *, parent="c_init", parent_ms=None, opt="tile", state="s_mem",
          accepted=False, review=None, flagged=False, next_state=None) -> StepRecord:
    speedup = parent_ms / time_ms if (verdict.is_valid and parent_ms and time_ms) else None
    return StepRecord(
        problem=problem, iteration=it, step=st, parent_candidate_id=parent, parent_time_ms=parent_ms,
        state_id=state, state_source="classified", optimization_id=opt,
        attempts=[_attempt(problem, cid, verdict, time_ms, flagged)], candidate_id=cid, verdict=verdict,
        review=review, accepted=accepted, speedup_vs_parent=speedup, tokens=_tokens("lower", problem, 100),
        next_state_id=next_state,
    )


def _write_campaign(root: Path) -> CampaignStore:
    store = CampaignStore(root)
    config = CampaignConfig(problems=[f"/x/{p}.py" for p in BASELINES], iterations=2, steps=2)
    store.write_status(CampaignStatus(config=config, kb_path="/x/kb.json"))
    store.write_kb_start(KBSnapshot(states=16, discovered_states=0, optimizations=60, deprecated_optimizations=0,
                                    lessons=0, outcomes=0, measured_scores=0, bytes=1000))
    for problem, verdict, time_ms in (("pa", Verdict.slower, 1.25), ("pb", Verdict.faster, 0.5),
                                      ("pc", Verdict.compile_error, None)):
        store.write_initial(InitialRecord(
            problem=problem, problem_hash="h", problem_path=f"/x/{problem}.py",
            attempts=[_attempt(problem, f"c_{problem}0", verdict, time_ms)], candidate_id=f"c_{problem}0",
            verdict=verdict, accepted=verdict.is_valid, tokens=_tokens("generate", problem, 1000),
        ))
    rejected = ReviewRecord(accepted=False, issues=["ignores the bias"])
    for record in (
        _step("pa", 0, 0, "c_a1", Verdict.faster, 0.8, parent="c_pa0", parent_ms=1.25, accepted=True, state="s_mem",
              next_state="s_comp"),
        _step("pa", 0, 1, "c_a2", Verdict.compile_error, parent="c_a1", opt="fuse", state="s_comp"),
        _step("pa", 1, 0, "c_a3", Verdict.faster, 0.5, parent="c_a1", parent_ms=0.8, opt="vec", review=rejected),
        _step("pa", 1, 1, "c_a4", Verdict.faster, 0.1, parent="c_a1", parent_ms=0.8, opt="vec", flagged=True),
        _step("pb", 0, 0, "c_b1", Verdict.incorrect, parent="c_pb0", opt="tile"),
    ):
        store.write_step(record)
    return store


def test_report_numbers_follow_the_raw_records(tmp_path: Path) -> None:
    store = _write_campaign(tmp_path / "camp")
    report = report_from_store(store)
    by = {r.problem: r for r in report.problems}

    # pa: baseline min(2.0, 1.0); best usable is c_a1 (0.5 was review-rejected, 0.1 flagged)
    assert by["pa"].baseline_ms == 1.0 and by["pa"].best_ms == 0.8 and by["pa"].best.origin == "i000/s000"
    assert math.isclose(by["pa"].best_speedup, 1.0 / 0.8)
    assert math.isclose(by["pa"].best_vs_eager, 2.0 / 0.8)
    assert math.isclose(by["pa"].initial_speedup, 1.0 / 1.25)
    # pb: the initial kernel stays best (its only step was incorrect)
    assert by["pb"].best.origin == "initial" and math.isclose(by["pb"].best_speedup, 1.0 / 0.5)
    assert not by["pc"].valid and by["pc"].best is None and not by["pc"].compiled

    speedups = [1.0 / 0.8, 1.0 / 0.5]
    assert report.valid_rate == 2 / 3
    assert math.isclose(report.speedup.geomean, math.sqrt(speedups[0] * speedups[1]))
    assert math.isclose(report.speedup.mean, sum(speedups) / 2)
    assert math.isclose(report.speedup.median, sum(speedups) / 2)
    assert (report.speedup.min, report.speedup.max) == (min(speedups), max(speedups))
    assert report.fast_p["1"] == 2 / 3 and report.fast_p["1.5"] == 1 / 3 and report.fast_p["2"] == 0.0
    assert report.step_valid_rate == 1 / 5  # 3 valid verdicts, but one rejected by review and one flagged
    assert report.candidates == 8 and math.isclose(report.compile_rate, 6 / 8)

    usage = {o.optimization_id: o for o in report.optimizations}
    assert (usage["tile"].selected, usage["tile"].improved, usage["tile"].verify_failures) == (2, 1, 1)
    assert usage["fuse"].compile_errors == 1 and usage["vec"].review_rejected == 1 and usage["vec"].valid == 0
    assert [(t.state_id, t.optimization_id, t.next_state_id, t.count) for t in report.transitions] == [
        ("s_mem", "tile", "s_comp", 1)
    ]
    assert report.tokens.by_role["generate"].prompt_tokens == 3000
    assert report.tokens.by_role["lower"].calls == 5
    assert report.tokens.by_problem["pa"].total == 1500 + 4 * 150


def test_editing_a_raw_record_changes_the_report(tmp_path: Path) -> None:
    store = _write_campaign(tmp_path / "camp")
    before = report_from_store(store)
    path = tmp_path / "camp" / "raw" / "steps" / "pa" / "i000_s000.json"
    data = json.loads(path.read_text())
    data["attempts"][0]["record"]["time_ms"] = 0.25
    path.write_text(json.dumps(data))
    after = report_from_store(store)
    assert math.isclose(after.problems[0].best_speedup, 4.0)
    assert after.speedup.geomean != before.speedup.geomean


def test_report_files_are_written(tmp_path: Path) -> None:
    store = _write_campaign(tmp_path / "camp")
    report = report_from_store(store)
    paths = write_report(report, store.report_dir)
    names = {p.name for p in paths}
    assert {"report.json", "report.md", *PLOTS} <= names
    for plot in PLOTS:
        assert (store.report_dir / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (store.report_dir / "report.md").read_text()
    assert f"{report.speedup.geomean:.2f}x" in markdown and "| pa |" in markdown
    assert json.loads((store.report_dir / "report.json").read_text())["valid_rate"] == report.valid_rate


def test_kb_growth_keeps_start_and_end_and_stays_bounded() -> None:
    from datetime import datetime, timedelta, timezone

    from kb_mcp.campaign.report import MAX_GROWTH_POINTS, kb_growth

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def snap(i: int) -> KBSnapshot:
        return KBSnapshot(states=23, discovered_states=0, optimizations=74, deprecated_optimizations=0, lessons=i,
                          outcomes=i, measured_scores=i, bytes=i, at=t0 + timedelta(seconds=i))

    steps = [StepRecord(problem="p", iteration=0, step=i, parent_candidate_id="c", kb=snap(i + 1)) for i in range(1000)]
    points = kb_growth(snap(0), steps[::-1], [])  # order on disk does not matter: time does
    assert len(points) == MAX_GROWTH_POINTS
    assert points[0].outcomes == 0 and points[-1].outcomes == 1000
    assert [p.outcomes for p in points] == sorted(p.outcomes for p in points)
    short = kb_growth(snap(0), steps[:5], [])
    assert [p.outcomes for p in short] == [0, 1, 2, 3, 4, 5]


def test_device_times_are_shown_beside_the_end_to_end_ones_and_never_rank(tmp_path: Path) -> None:
    store = _write_campaign(tmp_path / "camp")
    path = tmp_path / "camp" / "raw" / "steps" / "pa" / "i000_s000.json"  # c_a1, pa's best kernel
    data = json.loads(path.read_text())
    data["attempts"][0]["record"] |= {"device_ms": 0.05, "eager_device_ms": 0.4}
    path.write_text(json.dumps(data))
    report = report_from_store(store)
    by = {r.problem: r for r in report.problems}
    pa = by["pa"]
    assert (pa.best_ms, pa.best_device_ms, pa.eager_device_ms) == (0.8, 0.05, 0.4)
    assert pa.best is not None and pa.best.device_ms == 0.05
    assert math.isclose(pa.best_vs_eager_device, 8.0) and math.isclose(pa.best_speedup, 1.0 / 0.8)
    assert by["pb"].best_device_ms is None and by["pb"].best_vs_eager_device is None
    assert report.speedup_vs_eager_device.n == 1 and math.isclose(report.speedup_vs_eager_device.geomean, 8.0)
    write_report(report, store.report_dir)
    markdown = (store.report_dir / "report.md").read_text()
    assert "| eager, device time (informative) | 1 | 8.00x |" in markdown
    assert "| best vs eager (device) |" in markdown and "| 0.4 | 0.05 | 8.00x |" in markdown
    assert "Device time: the summed GPU durations" in markdown


def test_a_report_says_where_it_ran_apart_from_how_each_problem_was_judged() -> None:
    from kb_mcp.campaign.models import CampaignConfig
    from kb_mcp.campaign.report import CampaignReport, GradientSummary, ProblemResult, SpeedupStats

    problems = [ProblemResult(problem="own", initial_verdict=Verdict.faster, mode="own"),
                ProblemResult(problem="a", initial_verdict=Verdict.slower, mode="composed", coverage=0.4),
                ProblemResult(problem="b", initial_verdict=Verdict.invalid, mode="composed"),
                ProblemResult(problem="missing", mode="composed")]  # no solution: judged by no mode
    stats = SpeedupStats.of([])

    def report(mode: str) -> CampaignReport:
        return CampaignReport(mode=mode, config=CampaignConfig(problems=["/p/x.py"]), problems=problems,
                              valid_rate=0.5, step_valid_rate=None, compile_rate=None, candidates=3, speedup=stats,
                              speedup_vs_eager=stats, speedup_vs_compile=stats, initial_speedup=stats, fast_p={},
                              optimizations=[], state_visits={}, transitions=[], kb_growth=[],
                              gradient=GradientSummary(), tokens=TokenLedger())

    assert report("gpu").verification_modes() == "own kernels 1, composed 2"
    assert (report("gpu").run_label(), report("compile-only").run_label()) == ("on the GPU", "compile only")
