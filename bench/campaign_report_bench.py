"""How long rebuilding a campaign report from its raw records takes, at the paper's scale and beyond.

A campaign recomputes its report (and best kernels) from the raw per-step records rather than
keeping running totals, so this is the price of that choice. Synthetic records, real files:

    python bench/campaign_report_bench.py [--problems 100] [--iterations 10] [--steps 10]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from kb_mcp.campaign.models import (
    AttemptRecord,
    CampaignConfig,
    CampaignStatus,
    InitialRecord,
    KBSnapshot,
    StepRecord,
)
from kb_mcp.campaign.report import report_from_store
from kb_mcp.campaign.report_render import write_report
from kb_mcp.campaign.store import CampaignStore
from kb_mcp.clients.llm import TokenCount, TokenLedger
from kb_mcp.kb.models import CandidateRecord, Verdict

VERDICTS = [Verdict.faster, Verdict.slower, Verdict.compile_error, Verdict.incorrect]


def _attempt(cid: str, problem: str, verdict: Verdict, time_ms: float | None, eager_ms: float | None,
             compile_ms: float | None) -> AttemptRecord:
    record = CandidateRecord(candidate_id=cid, problem=problem, problem_hash="h", verdict=verdict, time_ms=time_ms,
                             eager_ms=eager_ms, compile_ms=compile_ms)
    return AttemptRecord(record=record)


def _ledger(rng: random.Random, role: str, problem: str) -> TokenLedger:
    ledger = TokenLedger()
    ledger.record(role, problem, TokenCount(calls=1, prompt_tokens=rng.randint(2000, 6000), completion_tokens=900))
    return ledger


def _snapshot(i: int) -> KBSnapshot:
    return KBSnapshot(states=23, discovered_states=0, optimizations=74, deprecated_optimizations=0, lessons=i // 8,
                      outcomes=i, measured_scores=min(i, 400), bytes=100_000 + 300 * i)


def populate(root: Path, problems: int, iterations: int, steps: int, seed: int = 0) -> CampaignStore:
    """Writes a campaign folder of synthetic but well-formed records."""
    rng = random.Random(seed)
    store = CampaignStore(root)
    config = CampaignConfig(problems=[f"/bench/p{i:04d}.py" for i in range(problems)], iterations=iterations,
                            steps=steps)
    store.write_status(CampaignStatus(config=config, kb_path="/bench/kb.json"))
    store.write_kb_start(_snapshot(0))
    n = 0
    for p in range(problems):
        name = f"p{p:04d}"
        eager, compiled = rng.uniform(0.1, 10), rng.uniform(0.1, 10)
        t0 = rng.uniform(0.5, 1.5) * min(eager, compiled)
        store.write_initial(InitialRecord(
            problem=name, problem_hash="h", problem_path=f"/bench/{name}.py", accepted=True,
            attempts=[_attempt(f"c_{name}", name, Verdict.faster, t0, eager, compiled)],
            tokens=_ledger(rng, "generate", name)))
        for it in range(iterations):
            for st in range(steps):
                verdict = rng.choice(VERDICTS)
                t = t0 * rng.uniform(0.6, 1.3) if verdict.is_valid else None
                cid = f"c_{name}_{it}_{st}"
                store.write_step(StepRecord(
                    problem=name, iteration=it, step=st, parent_candidate_id=f"c_{name}", parent_time_ms=t0,
                    state_id=rng.choice(["memory_bandwidth_saturated", "hybrid_bound", "insufficient_parallelism"]),
                    state_source="classified", optimization_id=f"opt_{rng.randrange(40)}",
                    accepted=bool(t and t < t0), speedup_vs_parent=t0 / t if t else None,
                    next_state_id="hybrid_bound" if t and t < t0 else None, outcome_recorded=True,
                    attempts=[_attempt(cid, name, verdict, t, eager if t else None, compiled if t else None)],
                    tokens=_ledger(rng, "lower", name), kb=_snapshot(n)))
                n += 1
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        store = populate(Path(tmp) / "camp", args.problems, args.iterations, args.steps)
        written = time.perf_counter() - t
        records = args.problems * (1 + args.iterations * args.steps)
        t = time.perf_counter()
        report = report_from_store(store)
        built = time.perf_counter() - t
        t = time.perf_counter()
        write_report(report, store.report_dir)
        rendered = time.perf_counter() - t
    print(f"{records} raw records ({args.problems} problems x {args.iterations} x {args.steps} steps + initials)")
    print(f"write records (atomic, fsync): {written:.2f} s total, {1e3 * written / records:.2f} ms per record")
    print(f"report from raw records:       {built:.2f} s")
    print(f"report.json/.md + 4 PNG plots: {rendered:.2f} s")
    print(f"geomean speedup {report.speedup.geomean:.3f}x over {report.speedup.n} problems (synthetic data)")


if __name__ == "__main__":
    main()
