"""The simulator's plots: learning curves, drift recovery, poisoning and multi-step bars (PNG files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from learnsim.regimes import DRIFT_CURVE, MEANS
from learnsim.run import Config
from learnsim.starts import ATTACKS, CREDIT_RULES
from learnsim.stats import interval

COLOURS = {"uniform": "tab:gray", "old rule": "tab:orange", "new rule": "tab:blue", "new rule, no change": "tab:green",
           MEANS: "tab:purple", "new rule, eager cap": "tab:red"}


def plot(results: list[dict[str, Any]], cfg: Config, out_dir: Path) -> None:
    """Every plot the results allow, as PNG files in out_dir."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bandit = [r["bandit"] for r in results if "bandit" in r]
    kinds = [k for k in cfg.kinds if bandit and k in bandit[0]]
    if kinds:
        _save(plt, _bandit(plt, bandit, kinds), out_dir / "bandit_learning.png")
    for key in ("drift", "drift_shuffle"):
        rows = [r[key] for r in results if key in r]
        if rows:
            _save(plt, _drift(plt, rows), out_dir / f"{key}.png")
    poison = [r["poison"] for r in results if "poison" in r]
    if poison:
        _save(plt, _poison(plt, poison), out_dir / "poisoning.png")
    multi = [r["multistep"] for r in results if "multistep" in r]
    if multi:
        _save(plt, _multistep(plt, multi), out_dir / "multistep.png")


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _band(ax: Any, xs: list[int], stats: list[tuple[float, float]], name: str) -> None:
    colour = COLOURS[name]
    ax.plot(xs, [m for m, _ in stats], label=name, color=colour)
    ax.fill_between(xs, [m - h for m, h in stats], [m + h for m, h in stats], color=colour, alpha=0.2)


def _bandit(plt: Any, bandit: list[dict[str, Any]], kinds: list[str]) -> Any:
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.6), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, kind in zip(axes, kinds):
        for name in ("uniform", "old rule", "new rule"):
            curves = [b[kind]["curve"][name] for b in bandit if kind in b]
            xs = [50 * (i + 1) for i in range(len(curves[0]))]
            _band(ax, xs, [interval([c[i] for c in curves]) for i in range(len(xs))], name)
        ax.axhline(1.0, color="black", lw=0.8, ls="--", label="oracle")
        ax.set_title(f"{kind} priors")
        ax.set_xlabel("rollout")
    axes[0].set_ylabel("share of oracle gain (50-rollout window)")
    axes[0].legend(loc="lower right")
    return fig


def _drift(plt: Any, rows: list[dict[str, Any]]) -> Any:
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, (scale, label) in zip(axes, (("share", "share of oracle gain"), ("gap", "gap closed, uniform to oracle"))):
        for name in DRIFT_CURVE:
            curves = [row[scale][name] for row in rows]
            ks = sorted({k for c in curves for k in c})
            _band(ax, ks, [interval([c[k] for c in curves if k in c]) for k in ks], name)
        ax.axvline(0.5, color="black", lw=0.8, ls=":")
        ax.set_xlabel("problems of a state since the truth changed")
        ax.set_ylabel(label)
    axes[0].legend(loc="lower right", fontsize="small")
    return fig


def _poison(plt: Any, poison: list[dict[str, Any]]) -> Any:
    fig, axes = plt.subplots(1, len(ATTACKS), figsize=(5 * len(ATTACKS), 3.6), sharey=True, squeeze=False)
    for ax, (attack, slowness) in zip(axes[0], ATTACKS.items()):
        for name in ("old rule", *CREDIT_RULES):
            stats = [interval([p[attack][name][i] for p in poison]) for i in range(3)]
            ax.errorbar([0, 1, 4], [m for m, _ in stats], yerr=[h for _, h in stats], label=name,
                        color=COLOURS[name], marker="o", capsize=3)
        ax.axhline(0.1, color="black", lw=0.8, ls="--")
        ax.set_title(f"{attack}: parent {slowness:g}x slower than the reference")
        ax.set_xlabel("records from one client")
    axes[0][0].set_ylabel("first draw of the harmful optimization")
    axes[0][0].legend()
    return fig


def _multistep(plt: Any, multi: list[dict[str, Any]]) -> Any:
    names = list(multi[0]["final"])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    stats = [interval([m["final"][n] for m in multi]) for n in names]
    ax.bar(range(len(names)), [m for m, _ in stats], yerr=[h for _, h in stats], capsize=3)
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_ylabel("final log-speedup per problem")
    return fig
