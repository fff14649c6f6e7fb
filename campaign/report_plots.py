"""The campaign report's plots (matplotlib, Agg backend): each built as a Figure, then saved as PNG.

What each shows:

* `speedups.png`: per problem, the first and the best valid kernel's speedup over the better of
  eager and torch.compile, on a log scale (2x and 0.5x are equally far from 1x); a problem without
  a valid kernel is marked as failed, never drawn as a speedup of 0. A compile-only run has no
  timings: the plot shows which problems got a kernel that compiled, and how many steps ran.
* `fast_p.png`: fast_p curves (share of problems with a valid kernel faster than p x the baseline)
  per precision track, p on a log scale; compile-only: the compile and kernel rates.
* `optimizations.png`: per optimization, how often it was selected, gave a valid kernel and
  improved on its parent, side by side with counts.
* `kb_growth.png`: one small panel per KB quantity, each titled with its start, end and change.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kb_mcp.campaign.report import CampaignReport, ProblemResult, fast_p
from kb_mcp.kb.atomic import temp_beside

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOTS = ("fast_p.png", "speedups.png", "kb_growth.png", "optimizations.png")
DEFAULT_TRACK = "fp32"  # results without a precision track were checked in the reference's precision
MAX_OPTIMIZATIONS = 20

GOOD, BAD, FAIL, FIRST = "#2a7ab0", "#d08a1e", "#c0392b", "#8c8c8c"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def _integer_axis(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _times(value: float, _pos: object = None) -> str:
    return f"{value:g}x"


def track_of(result: ProblemResult) -> str:
    """The precision track a problem's result counts for."""
    track = getattr(result, "track", None)
    return str(getattr(track, "value", track) or DEFAULT_TRACK)


def speedup_figure(report: CampaignReport) -> Figure:
    """Per-problem speedups on a log scale, failures marked; compile counts in a compile-only run."""
    plt = _pyplot()
    problems = report.problems
    timed = [r for r in problems if r.best_speedup is not None or r.initial_speedup is not None]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(problems) + 2.5), 4.5))
    if not timed:
        return _compile_counts(fig, ax, report)
    from matplotlib.ticker import FuncFormatter

    values = [v for r in problems for v in (r.best_speedup, r.initial_speedup) if v is not None]
    low, high = min(0.5, min(values) / 1.5), max(2.0, max(values) * 1.5)
    xs = list(range(len(problems)))
    for x, r in zip(xs, problems):
        if r.valid and r.best_speedup is not None:
            color = GOOD if r.best_speedup >= 1.0 else BAD
            ax.vlines(x, 1.0, r.best_speedup, color=color, linewidth=3, alpha=0.6)
            ax.scatter([x], [r.best_speedup], color=color, s=60, zorder=3, label="best valid kernel")
            ax.annotate(_times(round(r.best_speedup, 2)), (x, r.best_speedup), textcoords="offset points",
                        xytext=(6, 0), va="center", fontsize=8)
        else:
            ax.scatter([x], [low * 1.15], marker="X", color=FAIL, s=90, zorder=3, label="no valid kernel (failed)")
            ax.annotate("failed", (x, low * 1.15), textcoords="offset points", xytext=(0, 9), ha="center",
                        fontsize=8, color=FAIL)
        if r.initial_speedup is not None:
            ax.scatter([x], [r.initial_speedup], facecolors="none", edgecolors=FIRST, s=45, zorder=2,
                       label="first kernel")
    ax.set_yscale("log", base=2)
    ax.set_ylim(low, high)
    ax.yaxis.set_major_formatter(FuncFormatter(_times))
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_xticks(xs, [r.problem for r in problems], rotation=45 if len(problems) > 4 else 0,
                  ha="right" if len(problems) > 4 else "center")
    ax.set_xlim(-0.6, len(problems) - 0.4)
    ax.set_ylabel("speedup over the better of eager and torch.compile")
    ax.set_title("Per-problem speedup (log scale; above the dotted line is faster)")
    _legend_below(ax)
    return fig


def _compile_counts(fig, ax, report: CampaignReport) -> Figure:
    names = [r.problem for r in report.problems]
    ys = list(range(len(names)))
    ax.barh(ys, [1 if r.compiled else 0 for r in report.problems], color=GOOD, label="has a kernel that compiled")
    ax.barh(ys, [0 if r.compiled else 1 for r in report.problems], color=FAIL, label="no kernel compiled")
    for y, r in zip(ys, report.problems):
        ax.text(1.02, y, f"{r.steps} step(s)", va="center", fontsize=8)
    ax.set_yticks(ys, names)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.3)
    ax.set_xticks([])
    ax.set_title("Compile-only run: nothing was timed (no GPU); kernels per problem")
    _legend_below(ax)
    return fig


def fast_p_figure(report: CampaignReport) -> Figure:
    """fast_p curves per precision track, p on a log scale; compile-only: compile and kernel rates."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    tracks: dict[str, list[ProblemResult]] = {}
    for r in report.problems:
        tracks.setdefault(track_of(r), []).append(r)
    speedups = [r.best_speedup for r in report.problems if r.best_speedup is not None]
    if not speedups:
        labels = ["candidates that compiled", "problems with a kernel"]
        n = max(len(report.problems), 1)
        rates = [report.compile_rate or 0.0, sum(r.compiled for r in report.problems) / n]
        bars = ax.bar(labels, rates, color=[GOOD, GOOD])
        ax.bar_label(bars, [f"{100 * v:.0f}%" for v in rates])
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("share")
        ax.set_title("Compile-only run: no timings, so no fast_p; compile rates instead")
        return fig
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    low, high = min(0.25, min(speedups) / 1.5), max(4.0, max(speedups) * 1.3)
    grid = [low * (high / low) ** (i / 300) for i in range(301)]
    for track, results in sorted(tracks.items()):
        ax.plot(grid, [fast_p(results, p) for p in grid], drawstyle="steps-post", linewidth=2,
                label=f"{track} ({len(results)} problem{'s' if len(results) != 1 else ''})")
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(_times))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("p: speedup over the better of eager and torch.compile")
    ax.set_ylabel("fast_p: share of problems faster than p")
    ax.set_title("fast_p per precision track")
    ax.legend(loc="upper right", frameon=False)
    return fig


def optimization_figure(report: CampaignReport) -> Figure:
    """Selected / valid / improved per optimization, side by side, integer counts."""
    plt = _pyplot()
    opts = sorted(report.optimizations, key=lambda o: (-o.selected, o.optimization_id))[:MAX_OPTIMIZATIONS]
    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.55 * len(opts) + 1.5)))
    if not opts:
        ax.text(0.5, 0.5, "no optimization was selected", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        ax.set_title("Optimization usage")
        return fig
    ys = list(range(len(opts)))
    height = 0.27
    for offset, (field, color, label) in zip(
        (-height, 0.0, height),
        (("selected", FIRST, "selected"), ("valid", GOOD, "valid kernel"), ("improved", "#2e8b57",
                                                                            "improved on its parent")),
    ):
        counts = [getattr(o, field) for o in opts]
        bars = ax.barh([y + offset for y in ys], counts, height=height, color=color, label=label)
        ax.bar_label(bars, [str(c) if c else "" for c in counts], padding=2, fontsize=8)
    ax.set_yticks(ys, [f"{o.optimization_id} ({o.improved}/{o.selected})" for o in opts])
    ax.invert_yaxis()
    _integer_axis(ax.xaxis)
    ax.set_xlabel("steps")
    ax.set_title("Optimization usage (improved/selected)")
    _legend_below(ax)
    return fig


GROWTH_FIELDS = (
    ("states", "states"), ("discovered_states", "discovered states"), ("optimizations", "optimizations"),
    ("lessons", "lessons"), ("outcomes", "outcomes"), ("measured_scores", "measured scores"),
)


def kb_growth_figure(report: CampaignReport) -> Figure:
    """One panel per KB quantity over the campaign, titled with how much it grew."""
    plt = _pyplot()
    points = report.kb_growth
    fig, axes = plt.subplots(2, 3, figsize=(10, 5.5), sharex=True)
    if not points:
        for ax in axes.flat:
            ax.set_axis_off()
        fig.suptitle("KB growth: no KB snapshots were recorded")
        return fig
    xs = list(range(len(points)))
    for ax, (field, label) in zip(axes.flat, GROWTH_FIELDS):
        values = [getattr(p, field) for p in points]
        grew = values[-1] - values[0]
        ax.step(xs, values, where="post", color=GOOD if grew > 0 else FIRST, linewidth=2)
        ax.set_title(f"{label}: {values[0]} -> {values[-1]} ({grew:+d})", fontsize=10,
                     fontweight="bold" if grew > 0 else "normal")
        _integer_axis(ax.yaxis)
        ax.margins(y=0.2)
    for ax in axes[-1]:
        ax.set_xlabel("snapshot")
        _integer_axis(ax.xaxis)
    fig.suptitle("KB growth over the campaign (start, then after each kernel and gradient batch)")
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[CampaignReport], Figure]] = {
    "fast_p.png": fast_p_figure,
    "speedups.png": speedup_figure,
    "kb_growth.png": kb_growth_figure,
    "optimizations.png": optimization_figure,
}


def _legend_below(ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    unique: dict[str, object] = {}
    for label, handle in zip(labels, handles):  # one entry per label (its first artist), however many carry it
        unique.setdefault(label, handle)
    if unique:
        ax.legend(unique.values(), unique.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.22),
                  ncol=min(3, len(unique)), frameon=False)


def write_plots(report: CampaignReport, folder: Path) -> list[Path]:
    """Draws every plot into `folder` (each PNG replaced atomically); returns their paths."""
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name in PLOTS:
        fig = FIGURES[name](report)
        path = folder / name
        tmp = temp_beside(path, suffix=".png")  # one per writer; matplotlib reads the format from the suffix
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        plt.close(fig)
        tmp.replace(path)
        written.append(path)
    return written
