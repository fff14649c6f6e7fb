"""Putting into a KB what `compile_and_verify` would have stored, and reading scores back, for
tests that must not need a GPU. The records go through the store's own API, exactly as the tool
writes them."""

from __future__ import annotations

from pathlib import Path

from kb_mcp.harness.problem import Problem, candidate_id, parse_problem
from kb_mcp.kb.models import ALL_ARCH, CandidateRecord, Score, Verdict
from kb_mcp.kb.store import KBStore

PROBLEM_SOURCE = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(1024, 1024)]


def get_init_inputs():
    return []
'''


def problem() -> Problem:
    """A small, valid KernelBench problem."""
    return parse_problem(PROBLEM_SOURCE, name="relu_test")


def verified_candidate(
    kb: Path,
    source: str,
    *,
    verdict: Verdict = Verdict.faster,
    time_ms: float | None = 0.5,
    eager_ms: float | None = 1.0,
    flagged: bool = False,
) -> str:
    """Stores the server's verdict on `source` (as compile_and_verify does) and returns its candidate_id."""
    prob = problem()
    cid = candidate_id(prob, source)
    record = CandidateRecord(
        candidate_id=cid,
        problem=prob.name,
        problem_hash=prob.hash,
        verdict=verdict,
        arch="sm_90",
        device="NVIDIA H100 80GB HBM3",
        time_ms=time_ms,
        eager_ms=eager_ms,
        speedup_vs_baseline=(eager_ms / time_ms) if (time_ms and eager_ms and verdict.is_valid) else None,
        flagged=flagged,
    )
    store = KBStore.open(kb)
    with store.transaction() as tx:
        tx.put_candidate(record)
    return cid


def pooled_score(kb: Path, state_id: str, optimization_id: str) -> Score | None:
    """The pooled score as a fresh reader of the file sees it."""
    return KBStore.open(kb).get_score(state_id, optimization_id, ALL_ARCH)


def outcome_count(kb: Path) -> int:
    """Outcomes in the replay buffer, as a fresh reader of the file sees them."""
    return sum(KBStore.open(kb).stats().outcomes.values())
