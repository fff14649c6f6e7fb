"""ncu's process reader (`profiling.ncu_run.NcuProcess`) keeps what the process prints within the
sandbox's bound (`harness.sandbox.waiting`): the profiling driver under ncu runs a candidate's code."""

from __future__ import annotations

import sys
from pathlib import Path

from kb_mcp.harness.sandbox.sandbox import Grant, detect
from kb_mcp.harness.sandbox.waiting import OUTPUT_LIMIT_CHARS
from kb_mcp.profiling.ncu_run import NcuProcess

MARKER = "characters of output left out"


def test_ncu_s_process_reader_keeps_a_flooding_driver_within_the_bound(tmp_path: Path) -> None:
    """The profiling driver runs the candidate under ncu, and the reader takes progress from each line."""
    script = ("import sys\nprint('==PROF== Profiling \"my_kernel\": 0%', flush=True)\n"
              "for _ in range(200): sys.stdout.write('w' * (1 << 20))\nprint()\nprint('tail line')\n")
    proc = NcuProcess([sys.executable, "-c", script], detect(), Grant(role="tool", scratch=tmp_path))
    run = proc.finish(120.0)
    assert run.returncode == 0 and not run.timed_out
    assert len(run.output) < OUTPUT_LIMIT_CHARS + 100 and MARKER in run.output
    assert run.output.startswith("==PROF== Profiling") and run.output.rstrip().endswith("tail line")
