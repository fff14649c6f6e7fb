"""One seed's run of every regime asked for (see `bench/learning_sim.py`)."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learnsim.regimes import run_arch, run_bandit, run_drift, run_multistep, run_transfer
from learnsim.starts import run_poison, run_start
from learnsim.world import make_world

DRIFT_KINDS = {"drift": "lose-best", "drift_shuffle": "shuffle"}


@dataclass(frozen=True)
class Config:
    """What one run measures: regimes, prior kinds and sizes."""

    rollouts: int = 900
    kinds: tuple[str, ...] = ("aligned", "uninformative", "misleading")
    regimes: tuple[str, ...] = ("bandit", "start", "poison", "drift", "drift_shuffle", "multistep", "transfer",
                                "arch")
    drift_rollouts: int = 1200
    problems: int = 120
    horizon: int = 6
    train: int = 300
    test: int = 100
    tmp: str | None = None


def run_seed(args: tuple[int, Config]) -> dict[str, Any]:
    """Every regime for one seed (each in its own fresh world and KB files)."""
    seed, cfg = args
    started = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix=f"learning-sim-{seed}-", dir=cfg.tmp))
    try:
        out: dict[str, Any] = {"seed": seed}
        if "bandit" in cfg.regimes or "poison" in cfg.regimes:
            kinds = cfg.kinds if "bandit" in cfg.regimes else ("aligned",)
            bandit = run_bandit(make_world(seed), seed, base, cfg.rollouts, kinds)
            out["bandit"] = {k: v for k, v in bandit.items() if not k.startswith("_")}
            if "poison" in cfg.regimes:
                out["poison"] = run_poison(make_world(seed), seed, base, bandit)
        if "start" in cfg.regimes:
            out["start"] = run_start(make_world(seed), seed, base, cfg.rollouts)
        for regime, kind in DRIFT_KINDS.items():
            if regime in cfg.regimes:
                out[regime] = run_drift(make_world(seed), seed, base, cfg.drift_rollouts, kind)
        if "multistep" in cfg.regimes:
            out["multistep"] = run_multistep(make_world(seed), seed, base, cfg.problems, cfg.horizon)
        if "transfer" in cfg.regimes:
            out["transfer"] = run_transfer(make_world(seed), seed, base, cfg.train, cfg.test)
        if "arch" in cfg.regimes:
            out["arch"] = run_arch(make_world(seed), seed, base, cfg.rollouts)
        out["wall_s"] = time.monotonic() - started
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)
