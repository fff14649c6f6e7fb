"""The report's plots, drawn from reports of a GPU run and of a compile-only run: each PNG has
content (pixels that are not background), and each figure shows what it promises (log scales,
failures marked as failures, one fast_p curve per track, grouped integer bars, titled growth)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_mcp.campaign.models import CampaignConfig, KBSnapshot
from kb_mcp.campaign.report import CampaignReport, GradientSummary, OptimizationUsage, ProblemResult, SpeedupStats
from kb_mcp.campaign.report_plots import (
    PLOTS,
    fast_p_figure,
    kb_growth_figure,
    optimization_figure,
    speedup_figure,
    write_plots,
)
from kb_mcp.clients.llm import TokenLedger


def _report(problems: list[ProblemResult], *, mode: str = "gpu", opts: list[OptimizationUsage] | None = None,
            growth: list[KBSnapshot] | None = None) -> CampaignReport:
    best = [r.best_speedup for r in problems if r.best_speedup is not None]
    return CampaignReport(
        mode=mode, config=CampaignConfig(problems=[f"/p/{r.problem}.py" for r in problems]), problems=problems,
        valid_rate=sum(r.valid for r in problems) / len(problems), step_valid_rate=0.5, compile_rate=0.75,
        candidates=12, speedup=SpeedupStats.of(best), speedup_vs_eager=SpeedupStats.of(best),
        speedup_vs_compile=SpeedupStats.of(best), initial_speedup=SpeedupStats.of(best), fast_p={},
        optimizations=opts or [], state_visits={}, transitions=[], kb_growth=growth or [],
        gradient=GradientSummary(), tokens=TokenLedger(),
    )


def _snapshot(states: int, lessons: int, outcomes: int) -> KBSnapshot:
    return KBSnapshot(states=states, discovered_states=states - 23, optimizations=40, deprecated_optimizations=0,
                      lessons=lessons, outcomes=outcomes, measured_scores=outcomes, bytes=1000 * (outcomes + 1))


GPU = [
    ProblemResult(problem="swish", initial_speedup=0.9, best_speedup=3.2, valid=True, compiled=True, steps=4),
    ProblemResult(problem="softmax", initial_speedup=0.4, best_speedup=0.8, valid=True, compiled=True, steps=4),
    ProblemResult(problem="gemm", valid=False, compiled=True, steps=4),
]
COMPILE_ONLY = [
    ProblemResult(problem="swish", valid=False, compiled=True, steps=3),
    ProblemResult(problem="gemm", valid=False, compiled=False, steps=3),
]
OPTS = [
    OptimizationUsage(optimization_id="fuse_elementwise_chain", selected=5, compiled=5, valid=4, improved=2),
    OptimizationUsage(optimization_id="vectorize_global_access", selected=3, compiled=2, valid=1, improved=1),
]
GROWTH = [_snapshot(23, 10, 0), _snapshot(24, 10, 3), _snapshot(24, 13, 6)]


def _content_share(png: Path) -> float:
    """The share of pixels that are not the white background."""
    import matplotlib.image as mpimg

    pixels = mpimg.imread(png)[..., :3]
    return float((pixels.min(axis=2) < 0.95).mean())


@pytest.mark.parametrize("problems", [GPU, COMPILE_ONLY], ids=["timed", "compile-only"])
def test_every_png_has_content(problems: list[ProblemResult], tmp_path: Path) -> None:
    mode = "gpu" if problems is GPU else "compile-only"
    written = write_plots(_report(problems, mode=mode, opts=OPTS, growth=GROWTH), tmp_path)
    assert [p.name for p in written] == list(PLOTS)
    for png in written:
        assert _content_share(png) > 0.02, png.name  # axes, labels and data, not a blank canvas
    assert not list(tmp_path.glob(".*tmp*"))


def test_speedups_are_on_a_log_scale_and_failures_are_marked() -> None:
    fig = speedup_figure(_report(GPU))
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.texts].count("failed") == 1  # gemm, never drawn as a speedup of 0
    low, high = ax.get_ylim()
    assert low > 0 and high > 3.2
    legend = ax.get_legend()
    assert {t.get_text() for t in legend.get_texts()} == {"best valid kernel", "first kernel",
                                                          "no valid kernel (failed)"}
    assert legend.get_bbox_to_anchor().y0 < ax.get_window_extent().y0  # below the axes, over no point


def test_a_compile_only_run_shows_what_compiled() -> None:
    ax = speedup_figure(_report(COMPILE_ONLY, mode="compile-only")).axes[0]
    assert "Compile-only" in ax.get_title()
    assert [round(p.get_width()) for p in ax.patches] == [1, 0, 0, 1]  # swish compiled, gemm did not


def test_fast_p_has_one_curve_per_track_on_a_log_axis() -> None:
    ax = fast_p_figure(_report(GPU)).axes[0]
    assert ax.get_xscale() == "log"
    curves = [line for line in ax.get_lines() if len(line.get_xdata()) > 2]
    assert len(curves) == 1 and curves[0].get_label() == "fp32 (3 problems)"
    ys = curves[0].get_ydata()
    assert max(ys) == pytest.approx(2 / 3) and min(ys) == 0.0  # gemm never counts as fast


def test_optimization_bars_sit_side_by_side_with_integer_ticks() -> None:
    ax = optimization_figure(_report(GPU, opts=OPTS)).axes[0]
    bars = ax.patches
    assert len(bars) == 3 * len(OPTS)
    centres = {round(b.get_y() + b.get_height() / 2, 3) for b in bars}
    assert len(centres) == len(bars)  # none drawn over another
    ticks = [t for t in ax.get_xticks() if 0 <= t <= 5]
    assert all(float(t).is_integer() for t in ticks)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fuse_elementwise_chain (2/5)",
                                                            "vectorize_global_access (1/3)"]


def test_kb_growth_titles_say_what_grew() -> None:
    fig = kb_growth_figure(_report(GPU, growth=GROWTH))
    titles = [ax.get_title() for ax in fig.axes]
    assert "states: 23 -> 24 (+1)" in titles and "lessons: 10 -> 13 (+3)" in titles
    assert "optimizations: 40 -> 40 (+0)" in titles
    assert all(ax.get_legend() is None for ax in fig.axes)  # nothing covers the lines
