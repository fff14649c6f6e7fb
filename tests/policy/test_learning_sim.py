"""A short run of bench/learning_sim.py: on the same worlds and the same streams, the shipped rule
(the real tools on a real KB file) earns more of the oracle's gain than the old rule."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from learnsim.regimes import quick_comparison  # noqa: E402


def test_the_new_rule_beats_the_old_one_on_the_same_seeds(tmp_path: Path) -> None:
    runs = [quick_comparison(seed, rollouts=120, n_states=3, folder=tmp_path) for seed in range(3)]
    for run in runs:
        assert run["new rule"] > run["old rule"], runs
    mean = {name: sum(r[name] for r in runs) / len(runs) for name in ("uniform", "old rule", "new rule")}
    assert mean["new rule"] - mean["old rule"] > 0.15, mean
    assert mean["old rule"] > mean["uniform"], mean  # the comparison itself is meaningful
