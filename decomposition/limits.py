"""How long a problem's own code may run while it is decomposed: the default and the range the
operator and an MCP caller may choose from (`kb-mcp decompose --timeout`, `kb-mcp compose --timeout`,
decompose_problem's `timeout_s`). No imports: the CLI reads it to build its `--help`."""

from __future__ import annotations

TIME_LIMIT_S = 180.0
"""Seconds each problem may take in each sandboxed step (the trace, the split), by default. The 44
KernelBench level-3 models trace in about 9 s each on a 2-core machine, the slowest in under a minute
(docs/benchmarks.md, "Level 3 decomposed"): three times the slowest leaves room for a busy machine,
and a model that never returns is reported after 3 minutes."""

MIN_TIME_LIMIT_S = 1.0
MAX_TIME_LIMIT_S = 3600.0
"""The range of a time limit one may ask for: an hour is far past any model's trace; past it, waiting
longer is not the fix."""


def time_limit(seconds: float) -> float:
    """`seconds` when it is a time limit one may ask for; ValueError saying the range otherwise."""
    if not MIN_TIME_LIMIT_S <= seconds <= MAX_TIME_LIMIT_S:  # NaN fails this too
        raise ValueError(f"a time limit for decomposing must be {MIN_TIME_LIMIT_S:g} to {MAX_TIME_LIMIT_S:g} "
                         f"seconds, not {seconds:g}")
    return seconds
