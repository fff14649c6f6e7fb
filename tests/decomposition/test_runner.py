"""Splitting a decomposition's work over processes: each entry once, each process's entries in their
order, the large ones spread so that the loads come out near each other."""

from __future__ import annotations

from kb_mcp.decomposition.runner import split


def test_the_largest_entries_go_to_the_least_loaded_process() -> None:
    costs = [512.0, 10.0, 12.0, 9.0, 300.0, 250.0, 11.0, 8.0]
    shares = split(costs, 2)
    assert sorted(i for share in shares for i in share) == list(range(len(costs)))
    assert all(share == sorted(share) for share in shares)
    loads = sorted(sum(costs[i] for i in share) for share in shares)
    assert loads[1] - loads[0] <= max(costs[i] for i in range(len(costs)) if costs[i] < 300)  # within one entry
    assert [0] in [s[:1] for s in shares] and 4 not in next(s for s in shares if 0 in s)  # 512 and 300 apart


def test_more_processes_than_entries_leaves_none_empty() -> None:
    assert split([3.0, 1.0], 4) == [[0], [1]]
