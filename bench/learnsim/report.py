"""Statistics over seeds and the printed report (see `bench/learning_sim.py`); the plots are in
`learnsim.plots`."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from learnsim.plots import plot
from learnsim.regimes import DRIFT_CURVE, MEANS
from learnsim.run import Config
from learnsim.starts import ATTACKS, CREDIT_RULES, START_KINDS
from learnsim.stats import fmt
from learnsim.world import ARCH_CORRELATION, ARCHES

Rows = list[dict[str, Any]]

DRIFT_WHAT = {
    "drift": "each state's best optimization stops paying (its effect drops to the state's worst)",
    "drift_shuffle": "each state's effects are dealt out again (nothing learnt stays true)",
}
DRIFT_KS = (1, 3, 5, 10, 15, 20, 30)
RECOVERED = 0.9
"""Recovered: the 3-problem mean level is back at this fraction of the reference level."""
DRIFT_SCALES = {
    "share": "share of the oracle's gain",
    "gap": "gap closed between uniform and the oracle (the scale a level before the change compares on)",
}


def report(results: Rows, cfg: Config, out_dir: Path, wall: float) -> str:
    """The printed tables (also written to out_dir/summary.txt), the raw results and the plots."""
    lines = [f"learning_sim: {len(results)} seeds, mean ± 95 % interval over seeds; wall {wall:.0f} s", ""]
    lines += _bandit(results, cfg) + _start(results, cfg) + _poison(results)
    for key in DRIFT_WHAT:
        lines += _drift(results, cfg, key)
    lines += _multistep(results, cfg) + _transfer(results, cfg) + _arch(results, cfg)
    text = "\n".join(lines)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.txt").write_text(text + "\n")
    (out_dir / "results.json").write_text(json.dumps(results, default=str))
    plot(results, cfg, out_dir)
    return text


def _bandit(results: Rows, cfg: Config) -> list[str]:
    if not any("bandit" in r for r in results):
        return []
    lines = [
        f"Bandit stream (single steps on fresh problems, {cfg.rollouts} rollouts): share of the oracle's per-step gain",
        f"{'priors':<14}{'rule':<16}{'rollouts 1-300':>18}{'301-600':>18}{'601-900':>18}{'to 90% early':>16}",
    ]
    for kind in cfg.kinds:
        rows = [r["bandit"][kind] for r in results if kind in r.get("bandit", {})]
        if not rows:
            continue
        for name in ("uniform", "old rule", "new rule"):
            cells = "".join(f"{fmt([row[name][i] for row in rows]):>18}" for i in range(3))
            lines.append(f"{kind:<14}{name:<16}{cells}{fmt([row['to90'][name] for row in rows], 0):>16}")
        cells = "".join(f"{fmt([row[MEANS][i] for row in rows]):>18}" for i in range(3))
        lines.append(f"{kind:<14}{MEANS:<16}{cells}")
        oracle = fmt([row["to90"]["oracle"] for row in rows], 0)
        lines.append(f"{kind:<14}{'oracle':<16}{'1':>18}{'1':>18}{'1':>18}{oracle:>16}")
        gaps = {
            name: [(row["to90"]["uniform"] - row["to90"][name]) / (row["to90"]["uniform"] - row["to90"]["oracle"])
                   for row in rows]
            for name in ("old rule", "new rule")
        }
        lines.append(f"{'':<14}gap closed (uniform -> oracle, rollouts to 90 % of the oracle's gain over 300): "
                     f"old {fmt(gaps['old rule'])}, new {fmt(gaps['new rule'])}")
    return [*lines, ""]


def _poison(results: Rows) -> list[str]:
    rows = [r["poison"] for r in results if "poison" in r]
    if not rows:
        return []
    lines = [
        "Poisoning and sandbagging: first-draw probability of the worst optimization of the most visited state,",
        "after n records from one client, each an ordinary candidate (the harmful change applied and timed)",
        "credited against a parent the client verified deliberately slow: the first kernel of a fresh problem,",
        f"{ATTACKS['poisoning']:g}x slower than the reference (poisoning) or {ATTACKS['sandbagging']:g}x (sandbagging: "
        "as slow as a first kernel counts in full);",
        "'eager cap': the same tools with the credit rule before (KB: aligned, 900 rollouts)",
        f"{'attack':<14}{'rule':<22}{'n = 0':>18}{'n = 1':>18}{'n = 4':>18}",
    ]
    for attack in ATTACKS:
        for name in ("old rule", *CREDIT_RULES):
            cells = "".join(f"{fmt([row[attack][name][i] for row in rows], 3):>18}" for i in range(3))
            lines.append(f"{attack:<14}{name:<22}{cells}")
    return [*lines, "", *_suppress([row["suppress"] for row in rows if "suppress" in row])]


def _start(results: Rows, cfg: Config) -> list[str]:
    rows = [r["start"] for r in results if "start" in r]
    if not rows:
        return []
    eager = [r["bandit"]["aligned"] for r in results if "start" in r and "aligned" in r.get("bandit", {})]
    lines = [
        f"First kernels slower than the reference (aligned priors, the bandit stream's problems, {cfg.rollouts} "
        "rollouts): share of the oracle's per-step gain;",
        "each problem's first kernel is 1-4x or 1-10x slower than eager (log-uniform) and the step is recorded "
        "against it;",
        "'eager cap': the same tools with the credit rule before (a parent slower than the reference counts as the "
        "reference)",
        f"{'first kernels':<15}{'rule':<22}{'rollouts 1-300':>16}{'301-600':>16}{'601-900':>16}{'lowest seed':>13}",
    ]
    table = [("as eager", name, [row[name] for row in eager]) for name in ("uniform", "old rule", "new rule")
             if eager]
    table += [(kind, name, [row[kind][name] for row in rows]) for kind in START_KINDS
              for name in ("uniform", "old rule", *CREDIT_RULES)]
    for kind, name, thirds in table:
        cells = "".join(f"{fmt([t[i] for t in thirds]):>16}" for i in range(3))
        lines.append(f"{kind:<15}{name:<22}{cells}{min(t[2] for t in thirds):>13.2f}")
    leans = [("as eager", "new rule", [row["lean"] for row in eager if "lean" in row])]
    leans += [(kind, name, [row[kind]["lean"][name] for row in rows]) for kind in START_KINDS for name in CREDIT_RULES]
    lines += ["lean: the KB's measured means less the true ones after the stream (log units; scores holding 4 "
              "samples' weight or more)",
              "  " + "; ".join(f"{kind}, {name}: {fmt(values)}" for kind, name, values in leans if values)]
    return [*lines, ""]


def _suppress(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = [
        "Suppression: first-draw probability of the best optimization of the most visited state, after n records",
        "of real slow candidates credited to it by one client; 'alarmed': that client first raised the track's",
        "change alarm with slow outcomes credited to the other states' best (new rule, KB: aligned, 900 rollouts)",
        f"{'track':<10}{'alarm level':>18}{'n = 0':>18}{'n = 1':>18}{'n = 4':>18}",
    ]
    for case in ("quiet", "alarmed"):
        level = fmt([row[f"{case}_alarm_level"] for row in rows], 1)
        lines.append(f"{case:<10}{level:>18}" + "".join(f"{fmt([row[case][i] for row in rows], 3):>18}"
                                                       for i in range(3)))
    return [*lines, ""]


def _drift(results: Rows, cfg: Config, key: str) -> list[str]:
    rows = [r[key] for r in results if key in r]
    if not rows:
        return []
    lines = [
        f"Drift ({key}: aligned priors; after {cfg.drift_rollouts // 2} of {cfg.drift_rollouts} rollouts "
        f"{DRIFT_WHAT[key]}):",
        "level by problems of a state since the change; 'no change': the new rule on the same problems in a world",
        "whose changed truth held from the start (the level it reaches there had nothing changed)",
    ]
    for scale, what in DRIFT_SCALES.items():
        lines += [f"{what}:", f"{'rule':<21}{'before':>14}" + "".join(f"{'+' + str(k):>14}" for k in DRIFT_KS)
                  + f"{'recovered by':>14}{'vs no change':>14}"]
        lines += _drift_rows([row[scale] for row in rows])
    return [*lines, *_drift_windows([row["gap"] for row in rows], key), ""]


DRIFT_WINDOWS = {"before": range(-10, 0), "+1-5": range(1, 6), "+6-10": range(6, 11), "+11-15": range(11, 16),
                 "+16-30": range(16, 31)}
TARGET_WINDOW = "+11-15"
"""The problems the drift target is judged over: the last of the 15 problems of a state it allows."""
TARGET_BY = 15
"""The drift target: the rule back at RECOVERED of the no-change control within this many problems."""
CONTROL = "new rule, no change"


def _drift_windows(gap: Sequence[dict[str, Any]], key: str) -> list[str]:
    """Gap-scale means over windows of problems since the change, and recovery judged on them: the
    drift target (for `drift`) against the no-change control, the level the rule reaches in the
    changed world (back at RECOVERED of it within TARGET_BY problems, and RECOVERED of it over
    TARGET_WINDOW), beside the level before the change and MEANS."""
    names = ("new rule", CONTROL, MEANS)
    lines = ["gap closed, mean over problems of a state since the change:",
             f"{'rule':<21}" + "".join(f"{w:>14}" for w in DRIFT_WINDOWS)]
    for name in names:
        lines.append(f"{name:<21}" + "".join(f"{fmt([_window(row[name], ks) for row in gap]):>14}"
                                              for ks in DRIFT_WINDOWS.values()))
    ks = DRIFT_WINDOWS[TARGET_WINDOW]
    after = {name: level(gap, name, ks) for name in names}
    before = level(gap, "new rule", DRIFT_WINDOWS["before"])
    back = recovery(gap, "new rule", level(gap, CONTROL, range(1, 31)))
    held = after["new rule"] / after[CONTROL]
    met = back != "> 28" and int(back) <= TARGET_BY and held >= RECOVERED
    paired = [_window(row["new rule"], ks) - _window(row[CONTROL], ks) for row in gap]
    what = f"drift target ({RECOVERED:.0%} of the no-change control within {TARGET_BY} problems)" if key == "drift" \
        else "recovery against the no-change control"
    lines += [
        f"{what}: back at {RECOVERED:.0%} of it by problem {back}; over {TARGET_WINDOW} "
        f"{after['new rule']:.3f} against {after[CONTROL]:.3f}, {held:.0%} of it (paired {fmt(paired, 3)}): "
        f"{'met' if met else 'not met'}",
        f"  against its own level before ({before:.3f}): {after['new rule'] / before:.0%} over {TARGET_WINDOW}, back "
        f"at {RECOVERED:.0%} of it by problem {recovery(gap, 'new rule', before)}; against {MEANS} "
        f"({after[MEANS]:.3f}): {after['new rule'] / after[MEANS]:.0%} (before: "
        f"{before / level(gap, MEANS, DRIFT_WINDOWS['before']):.0%})",
    ]
    return lines


def _window(curve: dict[int, float], ks: Sequence[int]) -> float:
    values = [curve[k] for k in ks if k in curve]
    return statistics.fmean(values) if values else math.nan


def _drift_rows(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per rule: the level before, at DRIFT_KS, and when it is back (`recovery`)."""
    lines = []
    control = level(rows, CONTROL, range(1, 31))
    for name in DRIFT_CURVE:
        pre = [_window(row[name], DRIFT_WINDOWS["before"]) for row in rows]
        cells = [fmt(pre)] + [fmt([row[name].get(k, math.nan) for row in rows]) for k in DRIFT_KS]
        own = recovery(rows, name, statistics.fmean(pre)) if name != "uniform" else ""
        against = recovery(rows, name, control) if name == "new rule" else ""
        lines.append(f"{name:<21}" + "".join(f"{c:>14}" for c in cells) + f"{own:>14}{against:>14}")
    return lines


def level(rows: Sequence[dict[str, Any]], name: str, ks: Sequence[int]) -> float:
    """The mean level of `name` over the problems `ks` of a state (relative to the change), over seeds."""
    return statistics.fmean(_window(row[name], ks) for row in rows)


def recovery(rows: Sequence[dict[str, Any]], name: str, reference: float) -> str:
    """Problems after the change until the 3-problem mean level is back at RECOVERED x `reference`."""
    curve = {k: statistics.fmean(row[name][k] for row in rows if k in row[name]) for k in range(1, 31)
             if any(k in row[name] for row in rows)}
    for k in range(1, 29):
        window = [curve[j] for j in (k, k + 1, k + 2) if j in curve]
        if len(window) == 3 and statistics.fmean(window) >= RECOVERED * reference:
            return str(k)
    return "> 28"


def _multistep(results: Rows, cfg: Config) -> list[str]:
    rows = [r["multistep"] for r in results if "multistep" in r]
    if not rows:
        return []
    lines = [
        f"Multi-step ({cfg.problems} problems of {cfg.horizon} steps, aligned priors; the later half): final "
        "log-speedup per problem, steps to 90 % of it, share of steps re-applying the lineage",
        f"{'rule':<30}{'final log-speedup':>20}{'steps to 90 %':>18}{'re-applied':>16}",
    ]
    for name in rows[0]["final"]:
        cells = [fmt([row[part][name] for row in rows]) for part in ("final", "to90", "reapplied")]
        lines.append(f"{name:<30}{cells[0]:>20}{cells[1]:>18}{cells[2]:>16}")
    return [*lines, ""]


def _transfer(results: Rows, cfg: Config) -> list[str]:
    rows = [r["transfer"] for r in results if "transfer" in r]
    if not rows:
        return []
    lines = [f"Transfer (uninformative priors, trained on {cfg.train} rollouts of set A): share on the first "
             f"{cfg.test} rollouts of set B, trained minus fresh KB"]
    for mode in ("shared states", "disjoint states"):
        cells = "".join(f"{name}: {fmt([row[mode][name] for row in rows])}   " for name in ("old rule", "new rule"))
        lines.append(f"{mode:<18}{cells}")
    return [*lines, ""]


def _arch(results: Rows, cfg: Config) -> list[str]:
    rows = [r["arch"] for r in results if "arch" in r]
    if not rows:
        return []
    lines = [f"Cross-arch (two families, truths correlated {ARCH_CORRELATION}, uninformative priors): share over "
             f"the last third of {cfg.rollouts} rollouts"]
    for family in ARCHES:
        cells = "".join(f"{name}: {fmt([row[family][name] for row in rows])}   " for name in rows[0]["hopper"])
        lines.append(f"{family:<10}{cells}")
    return [*lines, ""]
