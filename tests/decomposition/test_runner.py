"""Splitting a decomposition's work over processes: each entry once, each process's entries in their
order, the large ones spread so that the loads come out near each other."""

from __future__ import annotations

from pathlib import Path

from kb_mcp.decomposition.runner import run, split

ENDLESS = Path(__file__).parent / "endless_model.py"


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


def _problem(build: str) -> dict[str, object]:
    """A tiny problem whose Model's construction runs `build` first."""
    return {"source": "import time\nimport torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                      f"    def __init__(self):\n        super().__init__()\n        {build}\n"
                      "        self.fc = nn.Linear(4, 4)\n\n    def forward(self, x):\n        return self.fc(x)\n\n\n"
                      "def get_inputs():\n    return [torch.randn(2, 4)]\n\n\ndef get_init_inputs():\n    return []\n"}


def test_a_problem_past_its_time_limit_is_named_and_the_ones_after_it_still_run() -> None:
    endless = {"source": ENDLESS.read_text()}
    first, second = run("trace", [endless, _problem("pass")], timeout_s=4)
    assert first["ok"] is False and first["timed_out"] == 4
    assert "own code" in first["error"] and "ran past the time limit of 4 s" in first["error"]
    assert second["ok"] is True, second  # in a fresh worker: the stopped one took nothing else with it


def test_each_problem_has_its_own_time_limit_not_a_share_of_one() -> None:
    # three problems in one worker, together well past the limit, each within it
    slow = _problem("time.sleep(7)")
    answers = run("trace", [_problem("pass"), slow, slow], timeout_s=12)
    assert [a["ok"] for a in answers] == [True, True, True], answers
