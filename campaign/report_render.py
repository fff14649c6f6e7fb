"""Writing a campaign report: report.json, report.md and PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

from kb_mcp.campaign.report import CampaignReport, SpeedupStats
from kb_mcp.campaign.report_plots import PLOTS, write_plots
from kb_mcp.campaign.store import atomic_write_text

__all__ = ["PLOTS", "render_markdown", "write_plots", "write_report"]


def _x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _stats_row(label: str, s: SpeedupStats) -> str:
    return f"| {label} | {s.n} | {_x(s.geomean)} | {_x(s.mean)} | {_x(s.median)} | {_x(s.min)} | {_x(s.max)} |"


DEVICE_ROW = "eager, device time (informative)"


def _device_rows(s: SpeedupStats) -> list[str]:
    """The speedup over eager in device time (kernel durations summed), where any was measured."""
    return [_stats_row(DEVICE_ROW, s)] if s.n else []


DEVICE_NOTE = ("Device time: the summed GPU durations of the kernels one forward launched (profiled in the census "
               "worker); it does not move with the host process as the end-to-end times do, which decide.")


def _header(report: CampaignReport) -> list[str]:
    c = report.config
    if c.kind == "eval":
        return ["# Evaluation report", "",
                f"Run: **{report.run_label()}** · {len(report.problems)} problems · track **{c.track.value}** · "
                f"verification mode: {report.verification_modes() or '-'} · "
                "one solution file per problem, verified through the harness (no LLM)"]
    return ["# Campaign report", "",
            f"Run: **{report.run_label()}** · {len(report.problems)} problems × {c.iterations} iterations × {c.steps} "
            "steps · "
            f"track **{c.track.value}** · top-k {c.top_k}, temperature {c.temperature:g}, fix attempts "
            f"{c.fix_attempts}, "
            f"textual gradient every {c.gradient_every or '-'} outcomes"]


def _summary(report: CampaignReport) -> list[str]:
    return [
        "## Summary",
        "",
        f"* valid rate (problems with a correct, timed kernel): {_pct(report.valid_rate)}",
        "* fast_p (share of all problems faster than p × baseline): "
        + ", ".join(f"p={k}: {_pct(v)}" for k, v in report.fast_p.items()),
        "",
        "Speedup (baseline: the faster of eager and torch.compile):",
        "",
        "| over | n | geomean | mean | median | min | max |",
        "|---|---|---|---|---|---|---|",
        _stats_row("best of eager/compile", report.speedup),
        _stats_row("eager", report.speedup_vs_eager),
        _stats_row("torch.compile", report.speedup_vs_compile),
        *_device_rows(report.speedup_vs_eager_device),
    ] + _other_tracks(report)


def _other_tracks(report: CampaignReport) -> list[str]:
    """Each other precision track's figures in a table of its own (never ranked with the headline's)."""
    out: list[str] = []
    for track, s in report.by_track.items():
        if track == report.config.track.value:
            continue
        out += ["", f"Track **{track}** (its own tolerance and scores; not comparable with the above): "
                f"{s.problems} problems, valid rate {_pct(s.valid_rate)}", "",
                "| over | n | geomean | mean | median | min | max |", "|---|---|---|---|---|---|---|",
                _stats_row("best of eager/compile", s.speedup), _stats_row("eager", s.speedup_vs_eager),
                _stats_row("torch.compile", s.speedup_vs_compile), *_device_rows(s.speedup_vs_eager_device)]
    return out


def mode_cell(mode: str, coverage: float | None) -> str:
    """A problem's mode as the tables show it: own kernels, or composed with its coverage."""
    if mode != "composed":
        return "own kernels"
    return "composed" + (f" ({coverage:.0%})" if coverage is not None else "")


def _eval_body(report: CampaignReport, lines: list[str]) -> str:
    """An eval's report: no LLM and no steps, so no optimizations, states, KB growth or tokens."""
    lines += [*_summary(report), "", "## Problems", "",
              "| problem | mode (coverage) | verdict | eager ms | compile ms | solution ms | vs eager | vs "
              "torch.compile | vs the better | eager device ms | solution device ms | vs eager (device) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report.problems:
        verdict = r.initial_verdict.value if r.initial_verdict else "(no solution)"
        lines.append(f"| {r.problem} | {mode_cell(r.mode, r.coverage)} | {verdict} | {_ms(r.eager_ms)} | "
                     f"{_ms(r.compile_ms)} | {_ms(r.best_ms)} | "
                     f"{_x(r.best_vs_eager)} | {_x(r.best_vs_compile)} | {_x(r.best_speedup)} | "
                     f"{_ms(r.eager_device_ms)} | {_ms(r.best_device_ms)} | {_x(r.best_vs_eager_device)} |")
    lines += ["", DEVICE_NOTE, "", "Plots: " + ", ".join(f"![{p}]({p})" for p in PLOTS), ""]
    return "\n".join(lines)


def render_markdown(report: CampaignReport) -> str:
    """The human-readable report."""
    lines = [*_header(report), ""]
    lines += [f"> {note}" for note in report.notes]
    if report.notes:
        lines.append("")
    if report.config.kind == "eval":
        return _eval_body(report, lines)
    for section in (_overview, _problems, _optimizations, _states, _knowledge_base, _tokens):
        lines += section(report)
    lines += ["", "Plots: " + ", ".join(f"![{p}]({p})" for p in PLOTS), ""]
    return "\n".join(lines)


def _overview(report: CampaignReport) -> list[str]:
    return [
        "## Summary",
        "",
        f"* valid rate (problems with a correct, timed kernel): {_pct(report.valid_rate)}",
        f"* step valid rate: {_pct(report.step_valid_rate)}; candidates compiled: {_pct(report.compile_rate)} "
        f"of {report.candidates}",
        "* fast_p (share of all problems faster than p × baseline): "
        + ", ".join(f"p={k}: {_pct(v)}" for k, v in report.fast_p.items()),
        "",
        "Speedup of the best kernel (baseline: the faster of eager and torch.compile):",
        "",
        "| over | n | geomean | mean | median | min | max |",
        "|---|---|---|---|---|---|---|",
        _stats_row("best of eager/compile", report.speedup),
        _stats_row("eager", report.speedup_vs_eager),
        _stats_row("torch.compile", report.speedup_vs_compile),
        *_device_rows(report.speedup_vs_eager_device),
        _stats_row("(initial kernel) best of eager/compile", report.initial_speedup),
        *_other_tracks(report),
        "",
    ]


def _problems(report: CampaignReport) -> list[str]:
    lines = [
        "## Problems",
        "",
        "| problem | mode | eager ms | compile ms | initial ms | best ms | initial speedup | best speedup | best "
        "kernel | steps (valid / improved) | eager device ms | best device ms | best vs eager (device) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.problems:
        best = "-" if r.best is None else f"{r.best.origin}{'' if r.best.verified else ' (unverified)'}"
        lines.append(
            f"| {r.problem} | {mode_cell(r.mode, None)} | {_ms(r.eager_ms)} | {_ms(r.compile_ms)} | "
            f"{_ms(r.initial_ms)} | {_ms(r.best_ms)} | "
            f"{_x(r.initial_speedup)} | {_x(r.best_speedup)} | {best} | {r.steps} ({r.valid_steps} / "
            f"{r.improved_steps}) | {_ms(r.eager_device_ms)} | {_ms(r.best_device_ms)} | "
            f"{_x(r.best_vs_eager_device)} |"
        )
    return lines + ["", DEVICE_NOTE]


def _optimizations(report: CampaignReport) -> list[str]:
    lines = [
        "",
        "## Optimizations",
        "",
        "| optimization | selected | compiled | valid | improved | success rate | geomean over parent | compile err | "
        "verify fail | review rejected |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in report.optimizations:
        lines.append(
            f"| {o.optimization_id} | {o.selected} | {o.compiled} | {o.valid} | {o.improved} | "
            f"{_pct(o.success_rate)} | "
            f"{_x(o.geomean_speedup)} | {o.compile_errors} | {o.verify_failures} | {o.review_rejected} |"
        )
    return lines


def _states(report: CampaignReport) -> list[str]:
    lines = ["", "## States and transitions", ""]
    lines += [f"* {state}: {n} steps" for state, n in report.state_visits.items()] or ["* (no steps)"]
    if report.transitions:
        lines += ["", "| state | optimization | next state | count |", "|---|---|---|---|"]
        lines += [f"| {t.state_id} | {t.optimization_id} | {t.next_state_id} | {t.count} |" for t in report.transitions]
    return lines


def _knowledge_base(report: CampaignReport) -> list[str]:
    g = report.gradient
    lines = [
        "",
        "## Knowledge base",
        "",
        f"Textual-gradient batches: {g.batches}; edits applied: {g.applied} "
        f"({', '.join(f'{k} {v}' for k, v in g.applied_by_kind.items()) or 'none'}); rejected: {g.rejected}.",
    ]
    lines += [f"* {err}" for err in g.errors]
    if report.kb_growth:
        first, last = report.kb_growth[0], report.kb_growth[-1]
        lines += [
            "",
            "| | states | optimizations | lessons | outcomes | measured scores | bytes |",
            "|---|---|---|---|---|---|---|",
            f"| start | {first.states} | {first.optimizations} | {first.lessons} | {first.outcomes} | "
            f"{first.measured_scores} | {first.bytes} |",
            f"| end | {last.states} | {last.optimizations} | {last.lessons} | {last.outcomes} | {last.measured_scores} "
            f"| {last.bytes} |",
        ]
    return lines


def _tokens(report: CampaignReport) -> list[str]:
    t = report.tokens
    lines = [
        "",
        "## Tokens",
        "",
        f"Total: {t.total.total} ({t.total.prompt_tokens} prompt, {t.total.completion_tokens} completion) in "
        f"{t.total.calls} calls.",
        "",
        "| role | calls | prompt | completion |",
        "|---|---|---|---|",
    ]
    lines += [f"| {k} | {v.calls} | {v.prompt_tokens} | {v.completion_tokens} |" for k, v in sorted(t.by_role.items())]
    lines += ["", "| problem | calls | tokens |", "|---|---|---|"]
    lines += [f"| {k} | {v.calls} | {v.total} |" for k, v in sorted(t.by_problem.items())]
    return lines


def write_report(report: CampaignReport, folder: Path) -> list[Path]:
    """Writes report.json, report.md and the plots; returns every path written."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "report.json", report.model_dump_json(indent=1))
    atomic_write_text(folder / "report.md", render_markdown(report))
    return [folder / "report.json", folder / "report.md", *write_plots(report, folder)]
