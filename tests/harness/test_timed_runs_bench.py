"""bench/timed_runs_bench.py on the host clock: each piece of a timed run measured, both ways a
series stops run side by side with every timed output re-checked, and the figures written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import timed_runs_bench as bench  # noqa: E402

from kb_mcp.harness.worker.timing import MAX_RUNS, MIN_RUNS  # noqa: E402

TINY = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


def get_inputs():
    return [torch.randn(128, 128)]


def get_init_inputs():
    return []
'''


def test_the_bench_measures_each_piece_and_both_stopping_rules(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    problem = tmp_path / "tiny.py"
    problem.write_text(TINY)
    out = tmp_path / "figures.json"
    assert bench.main([str(problem), "--rounds", "2", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["problem"] == "tiny.py" and row["device"] in ("cpu", "cuda")
    run = {"fresh inputs", "reference output", "timed call (flush, events, syncs)",
           "re-check, lean where finite (the harness's)", "re-check, general arithmetic"}
    a_set = {"set: cached blocks given back", "set: the candidate's copy of the inputs", "set: the full comparison",
             "set: both outputs' digests", "set: inputs against their pristine copy"}
    if row["device"] == "cuda":
        a_set.add("set: allocator poisoned (2 output-sized blocks)")
    assert set(row["pieces_ms"]) == run | a_set
    assert all(ms >= 0 for ms in row["pieces_ms"].values())  # a host-path no-op may round to 0
    assert all(row["pieces_ms"][name] > 0 for name in run)
    assert len(row["rounds"]) == 2
    for r in row["rounds"]:
        for rule in ("wall", "precise"):
            s = r[rule]
            assert MIN_RUNS <= s["runs"] <= MAX_RUNS and s["errors"] == 0  # the reference re-checks as right
            lo, hi = s["interval_ms"]
            assert 0 < lo <= s["median_ms"] <= hi
        assert r["median_ratio"] == pytest.approx(r["precise"]["median_ms"] / r["wall"]["median_ms"], rel=1e-3)
    printed = capsys.readouterr().out
    assert "tiny.py" in printed and printed.count("round ") == 2


def test_the_default_problems_are_the_examples_and_the_kernelbench_picks_that_exist(tmp_path: Path) -> None:
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "19_ReLU.py").write_text(TINY)
    args = bench.argparse.Namespace(problems=[], kernelbench=str(tmp_path))
    picked = bench.problems(args)
    assert [p.name for p in picked] == ["swish.py", "elementwise_chain_small.py", "19_ReLU.py"]
    assert all(p.is_file() for p in picked)
